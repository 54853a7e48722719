/* test_npy.c - CMocka tests for util/npy.[ch] and util/fp16.h. */
#if !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif

#include <fenv.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "fp16.h"
#include "npy.h"

/* ------------------------------------------------------------------------ */
/* helpers                                                                  */

static char g_dir[256];

static int setup_dir(void **state) {
  (void)state;
  const char *base = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/test_npy.XXXXXX", base && *base ? base : "/tmp");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown_dir(void **state) {
  (void)state;
  return rmdir(g_dir); /* every test removes its own files */
}

static void tmp_path(char *buf, size_t n, const char *name) {
  snprintf(buf, n, "%s/%s", g_dir, name);
}

static void write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

static unsigned char *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  unsigned char *buf = NULL;
  size_t cap = 0, len = 0;
  for (;;) {
    if (len == cap) {
      cap = cap ? 2 * cap : 4096;
      buf = realloc(buf, cap);
      assert_non_null(buf);
    }
    size_t r = fread(buf + len, 1, cap - len, f);
    len += r;
    if (r == 0) break;
  }
  fclose(f);
  *n = len;
  return buf;
}

/* Builds a .npy image: magic, version major.minor, header text exactly as
 * given (no padding), then ndata bytes of data. */
static unsigned char *make_npy(int major, int minor, const char *header, const void *data,
                               size_t ndata, size_t *len) {
  size_t hl = strlen(header);
  size_t pre = major == 1 ? 10 : 12;
  unsigned char *b = malloc(pre + hl + ndata + 1);
  assert_non_null(b);
  memcpy(b, "\x93NUMPY", 6);
  b[6] = (unsigned char)major;
  b[7] = (unsigned char)minor;
  b[8] = (unsigned char)(hl & 0xff);
  b[9] = (unsigned char)((hl >> 8) & 0xff);
  if (pre == 12) {
    b[10] = (unsigned char)((hl >> 16) & 0xff);
    b[11] = (unsigned char)((hl >> 24) & 0xff);
  }
  memcpy(b + pre, header, hl);
  if (ndata) memcpy(b + pre + hl, data, ndata);
  *len = pre + hl + ndata;
  return b;
}

/* Parses header + data (v1.0) and expects failure with kw in the message. */
static void expect_reject_hdr(const char *header, size_t ndata, const char *kw) {
  static const unsigned char zeros[4096];
  size_t len;
  char err[256];
  npy_array a;
  assert_true(ndata <= sizeof zeros);
  unsigned char *b = make_npy(1, 0, header, zeros, ndata, &len);
  memset(&a, 0x5a, sizeof a);
  int rc = npy_parse(b, len, &a, err, sizeof err);
  if (rc == 0 || strstr(err, kw) == NULL)
    fail_msg("header %s: rc=%d err='%s', expected keyword '%s'", header, rc, err, kw);
  assert_null(a.data);
  assert_int_equal(a.ndim, 0);
  npy_free(&a);
  free(b);
}

static void expect_reject_buf(const void *buf, size_t len, const char *kw) {
  char err[256];
  npy_array a;
  int rc = npy_parse(buf, len, &a, err, sizeof err);
  if (rc == 0 || strstr(err, kw) == NULL)
    fail_msg("len %zu: rc=%d err='%s', expected keyword '%s'", len, rc, err, kw);
  assert_null(a.data);
}

static void expect_accept_hdr(int major, const char *header, size_t ndata, npy_dtype dt,
                              int ndim, const int64_t *shape) {
  static const unsigned char zeros[4096];
  size_t len;
  char err[256] = "";
  npy_array a;
  unsigned char *b = make_npy(major, 0, header, zeros, ndata, &len);
  if (npy_parse(b, len, &a, err, sizeof err) != 0) fail_msg("header %s: %s", header, err);
  assert_int_equal(a.dtype, dt);
  assert_int_equal(a.ndim, ndim);
  for (int i = 0; i < ndim; i++) assert_int_equal(a.shape[i], shape[i]);
  assert_non_null(a.data);
  npy_free(&a);
  free(b);
}

/* ------------------------------------------------------------------------ */
/* round trips                                                              */

static void fill_pattern(npy_dtype dt, void *data, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    switch (dt) {
    case NPY_F32: ((float *)data)[i] = (float)i * 0.5f - 3.25f; break;
    case NPY_F16: ((uint16_t *)data)[i] = fp16_from_f32((float)i * 0.25f - 1.0f); break;
    case NPY_F64: ((double *)data)[i] = (double)i * 1e-3 - 1e10; break;
    case NPY_I32: ((int32_t *)data)[i] = (int32_t)(i * 7919 - 100000); break;
    case NPY_I64: ((int64_t *)data)[i] = (int64_t)i * 1000000007LL - (INT64_C(1) << 40); break;
    case NPY_U8: ((uint8_t *)data)[i] = (uint8_t)(i * 37); break;
    }
  }
}

static void roundtrip(npy_dtype dt, int ndim, const int64_t *shape) {
  char path[512], err[256] = "";
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  size_t nb = (size_t)n * npy_dtype_size(dt);
  void *data = malloc(nb ? nb : 1);
  assert_non_null(data);
  fill_pattern(dt, data, n);
  tmp_path(path, sizeof path, "rt.npy");
  if (npy_save(path, dt, ndim, shape, data, err, sizeof err) != 0) fail_msg("save: %s", err);

  /* File layout: v1.0, data 64-byte aligned, header ends with '\n'. */
  size_t flen;
  unsigned char *file = read_file(path, &flen);
  assert_true(flen >= 10);
  assert_memory_equal(file, "\x93NUMPY\x01\x00", 8);
  size_t hl = (size_t)file[8] | ((size_t)file[9] << 8);
  assert_int_equal((10 + hl) % 64, 0);
  assert_int_equal(file[10 + hl - 1], '\n');
  assert_int_equal(flen, 10 + hl + nb);
  free(file);

  npy_array a;
  if (npy_load(path, &a, err, sizeof err) != 0) fail_msg("load: %s", err);
  assert_int_equal(a.dtype, dt);
  assert_int_equal(a.ndim, ndim);
  for (int i = 0; i < ndim; i++) assert_int_equal(a.shape[i], shape[i]);
  for (int i = ndim; i < NPY_MAX_DIMS; i++) assert_int_equal(a.shape[i], 0);
  assert_int_equal(npy_numel(&a), n);
  assert_non_null(a.data);
  if (nb) assert_memory_equal(a.data, data, nb);
  npy_free(&a);
  assert_null(a.data);
  npy_free(&a); /* twice is fine */
  assert_int_equal(unlink(path), 0);
  free(data);
}

static void test_roundtrip_all(void **state) {
  (void)state;
  static const npy_dtype dts[] = {NPY_F32, NPY_F16, NPY_F64, NPY_I32, NPY_I64, NPY_U8};
  static const int64_t s1[] = {5}, s2[] = {2, 3}, s3[] = {3, 0, 2}, s4[] = {0},
                       s8[] = {2, 1, 3, 1, 2, 1, 1, 2}, sbig[] = {17, 33};
  for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
    roundtrip(dts[k], 0, NULL); /* scalar: ndim 0, one element */
    roundtrip(dts[k], 1, s1);
    roundtrip(dts[k], 2, s2);
    roundtrip(dts[k], 3, s3);   /* zero-size dimension */
    roundtrip(dts[k], 1, s4);
    roundtrip(dts[k], 8, s8);
    roundtrip(dts[k], 2, sbig);
  }
}

static void test_save_header_text(void **state) {
  (void)state;
  char path[512], err[256];
  const int64_t shape[] = {5};
  const float v[5] = {1, 2, 3, 4, 5};
  tmp_path(path, sizeof path, "hdr.npy");
  assert_int_equal(npy_save(path, NPY_F32, 1, shape, v, err, sizeof err), 0);
  size_t n;
  unsigned char *f = read_file(path, &n);
  const char *want = "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }";
  assert_true(n == 128 + 20); /* 10 + 59 + '\n' padded to 128 */
  assert_int_equal(f[8] | (f[9] << 8), 118);
  assert_memory_equal(f + 10, want, strlen(want));
  for (size_t i = 10 + strlen(want); i < 127; i++) assert_int_equal(f[i], ' ');
  assert_int_equal(f[127], '\n');
  assert_memory_equal(f + 128, v, sizeof v);
  free(f);
  /* Overwriting an existing file works and leaves no temporary behind. */
  assert_int_equal(npy_save(path, NPY_U8, 0, NULL, "\x07", err, sizeof err), 0);
  npy_array a;
  assert_int_equal(npy_load(path, &a, err, sizeof err), 0);
  assert_int_equal(a.dtype, NPY_U8);
  assert_int_equal(a.ndim, 0);
  assert_int_equal(npy_numel(&a), 1);
  assert_int_equal(((uint8_t *)a.data)[0], 7);
  npy_free(&a);
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  struct stat st;
  assert_int_not_equal(stat(tmp, &st), 0);
  assert_int_equal(unlink(path), 0);
}

/* ------------------------------------------------------------------------ */
/* header parsing                                                           */

static void test_parse_variants(void **state) {
  (void)state;
  const int64_t s23[] = {2, 3}, s5[] = {5}, s4[] = {4};
  expect_accept_hdr(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 24,
                    NPY_F32, 2, s23);
  expect_accept_hdr(1, "{'shape':(2,3),'fortran_order':False,'descr':'<f4'}", 24, NPY_F32, 2,
                    s23);
  expect_accept_hdr(1, "  {  \"descr\" : \"<i8\" ,\n 'shape' : ( 5 , ) ,'fortran_order':False , } \n",
                    40, NPY_I64, 1, s5);
  expect_accept_hdr(1, "{'descr':'<f2','fortran_order':False,'shape':(2L, 3L)}      \n", 12,
                    NPY_F16, 2, s23);
  expect_accept_hdr(1, "{'descr':'|u1','fortran_order':False,'shape':()}", 1, NPY_U8, 0, NULL);
  expect_accept_hdr(1, "{'descr':'<u1','fortran_order':False,'shape':(4,)}", 4, NPY_U8, 1, s4);
  expect_accept_hdr(1, "{'descr':'<i4','fortran_order':False,'shape':(2,3,)}", 24, NPY_I32, 2,
                    s23);
  expect_accept_hdr(2, "{'descr':'<f8','fortran_order':False,'shape':(5,)}\n", 40, NPY_F64, 1,
                    s5);
  expect_accept_hdr(3, "{'descr':'<f8','fortran_order':False,'shape':(5,)}\n", 40, NPY_F64, 1,
                    s5);
  expect_accept_hdr(1, "{'descr':'<f4','fortran_order':False,'shape':(0, 1152921504606846976)}",
                    0, NPY_F32, 2, (const int64_t[]){0, INT64_C(1152921504606846976)});
}

static void test_parse_data_copied(void **state) {
  (void)state;
  const int32_t v[3] = {-1, 2, 123456789};
  size_t len;
  unsigned char *b =
      make_npy(1, 0, "{'descr':'<i4','fortran_order':False,'shape':(3,)}", v, sizeof v, &len);
  npy_array a;
  char err[128];
  assert_int_equal(npy_parse(b, len, &a, err, sizeof err), 0);
  memset(b, 0, len);
  free(b);
  assert_memory_equal(a.data, v, sizeof v);
  npy_free(&a);
}

static void test_reject_preamble(void **state) {
  (void)state;
  const char *good = "{'descr':'<f4','fortran_order':False,'shape':(2,)}";
  size_t len;
  unsigned char *b = make_npy(1, 0, good, "\0\0\0\0\0\0\0\0", 8, &len);
  /* sanity: the image is valid */
  npy_array a;
  assert_int_equal(npy_parse(b, len, &a, NULL, 0), 0);
  npy_free(&a);

  unsigned char bad[64];
  memcpy(bad, b, sizeof bad);
  bad[1] = 'X';
  expect_reject_buf(bad, len < sizeof bad ? len : sizeof bad, "bad magic");
  expect_reject_buf("PK\x03\x04", 4, "bad magic");
  expect_reject_buf("", 0, "truncated");
  expect_reject_buf(NULL, 0, "truncated");
  for (size_t k = 1; k < 10; k++) expect_reject_buf(b, k, "truncated");
  for (size_t k = 10; k < 10 + strlen(good); k++) expect_reject_buf(b, k, "truncated header");
  for (size_t k = 10 + strlen(good); k < len; k++) expect_reject_buf(b, k, "truncated data");

  memcpy(bad, b, sizeof bad);
  bad[6] = 4;
  expect_reject_buf(bad, sizeof bad, "version 4.0");
  bad[6] = 1;
  bad[7] = 1;
  expect_reject_buf(bad, sizeof bad, "version 1.1");
  bad[6] = 0;
  bad[7] = 0;
  expect_reject_buf(bad, sizeof bad, "version");
  /* v2.0 with a header length beyond the limit / beyond the buffer */
  unsigned char v2[16] = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0xff, 0xff, 0xff, 0xff};
  expect_reject_buf(v2, sizeof v2, "too large");
  v2[10] = 0;
  v2[11] = 0;
  expect_reject_buf(v2, sizeof v2, "truncated header");
  expect_reject_buf(v2, 11, "truncated");
  free(b);

  /* trailing bytes after the data */
  b = make_npy(1, 0, good, "\0\0\0\0\0\0\0\0\0", 9, &len);
  expect_reject_buf(b, len, "trailing");
  free(b);
}

static void test_reject_header(void **state) {
  (void)state;
  expect_reject_hdr("{'descr':'<f4','fortran_order':True,'shape':(2,)}", 8, "Fortran order not supported");
  expect_reject_hdr("{'descr':'>f4','fortran_order':False,'shape':(2,)}", 8,
                    "unsupported dtype '>f4' (expected little-endian <f4, <f2, <f8, <i4, <i8 or |u1)");
  expect_reject_hdr("{'descr':'<c8','fortran_order':False,'shape':(2,)}", 16, "unsupported dtype '<c8'");
  expect_reject_hdr("{'descr':'|O','fortran_order':False,'shape':(2,)}", 16, "unsupported dtype '|O'");
  expect_reject_hdr("{'descr':'<U3','fortran_order':False,'shape':(2,)}", 24, "unsupported dtype '<U3'");
  expect_reject_hdr("{'descr':'>i8','fortran_order':False,'shape':(2,)}", 16, "unsupported dtype");
  expect_reject_hdr("{'descr':'|b1','fortran_order':False,'shape':(2,)}", 2, "unsupported dtype");
  expect_reject_hdr("{'descr':'','fortran_order':False,'shape':(2,)}", 2, "unsupported dtype");
  expect_reject_hdr("{'descr':[('a','<f4')],'fortran_order':False,'shape':(2,)}", 8,
                    "unsupported dtype");
  expect_reject_hdr("{'descr':'\x01\xff<f4 and a very long descr string indeed','fortran_order':False,'shape':(2,)}",
                    8, "unsupported dtype '?\?<f4");
  expect_reject_hdr("{'descr':'<f4','fortran_order':False,'shape':(1,1,1,1,1,1,1,1,1)}", 4,
                    "too many dimensions (9 > 8)");
  expect_reject_hdr("{'descr':'<f4','fortran_order':False,'shape':(2,-3)}", 0, "negative dimension -3");
  expect_reject_hdr("{'descr':'<f4','fortran_order':False,'shape':(-1,)}", 0, "negative dimension");
  expect_reject_hdr("{'descr':'<f8','fortran_order':False,'shape':(1099511627776,1099511627776)}", 0,
                    "overflow");
  expect_reject_hdr("{'descr':'<f8','fortran_order':False,'shape':(1152921504606846976,)}", 0,
                    "overflow"); /* 2^60 elements * 8 bytes */
  expect_reject_hdr("{'descr':'<f4','fortran_order':False,'shape':(0,4294967296,4294967296)}", 0,
                    "overflow");
  expect_reject_hdr("{'descr':'<u1','fortran_order':False,'shape':(99999999999999999999,)}", 0,
                    "overflow");
  /* malformed dicts */
  expect_reject_hdr("{'descr':'<f4','fortran_order':False}", 4, "missing key 'shape'");
  expect_reject_hdr("{'fortran_order':False,'shape':(1,)}", 4, "missing key 'descr'");
  expect_reject_hdr("{'descr':'<f4','shape':(1,)}", 4, "missing key 'fortran_order'");
  expect_reject_hdr("{'descr':'<f4','descr':'<f4','fortran_order':False,'shape':(1,)}", 4, "duplicate key");
  expect_reject_hdr("{'descr':'<f4','fortran_order':False,'shape':(1,),'extra':1}", 4, "unexpected key 'extra'");
  expect_reject_hdr("{'descr':'<f4','fortran_order':False,'shape':(1,)", 4, "malformed header");
  expect_reject_hdr("{'descr':'<f4','fortran_order':False,'shape':(1,)}x", 4, "malformed header");
  expect_reject_hdr("{'descr':'<f4','fortran_order':False,'shape':(5)}", 20, "must be a tuple");
  expect_reject_hdr("{'descr':'<f4','fortran_order':False,'shape':[5]}", 20, "must be a tuple");
  expect_reject_hdr("{'descr':'<f4','fortran_order':False,'shape':(1,,)}", 4, "malformed header");
  expect_reject_hdr("{'descr':'<f4','fortran_order':False,'shape':(1 2)}", 8, "malformed header");
  expect_reject_hdr("{'descr':'<f4','fortran_order':False,'shape':(1x,)}", 4, "malformed header");
  expect_reject_hdr("{'descr':'<f4','fortran_order':Falsey,'shape':(1,)}", 4, "malformed header");
  expect_reject_hdr("{'descr':'<f4','fortran_order':0,'shape':(1,)}", 4, "malformed header");
  expect_reject_hdr("{'descr':'<f4 ,'fortran_order':False,'shape':(1,)}", 4, "unsupported dtype '<f4 ,'");
  expect_reject_hdr("{'descr':'<f4", 4, "malformed header");
  expect_reject_hdr("{'descr':'<f4\"", 4, "malformed header");
  expect_reject_hdr("{'descr':'<\\f4','fortran_order':False,'shape':(1,)}", 4, "malformed header");
  expect_reject_hdr("{'descr':'<f4','fortran_order':False,'shape':(1,", 4, "malformed header");
  expect_reject_hdr("{'descr':'<f4','fortran_order':False,'shape':(-", 4, "malformed header");
  expect_reject_hdr("{'descr':'<f4','fortran_order':False,'shape':(", 4, "malformed header");
  expect_reject_hdr("{'descr':'<f4','fortran_order':Fal", 4, "malformed header");
  expect_reject_hdr("{'descr'", 4, "malformed header");
  expect_reject_hdr("{'", 4, "malformed header");
  expect_reject_hdr("{'descr':<f4,'fortran_order':False,'shape':(1,)}", 4, "malformed header");
  expect_reject_hdr("{'descr' '<f4','fortran_order':False,'shape':(1,)}", 4, "malformed header");
  expect_reject_hdr("", 4, "malformed header");
  expect_reject_hdr("   \n", 4, "malformed header");
  expect_reject_hdr("{", 4, "malformed header");
  expect_reject_hdr("{}", 4, "missing key");
  expect_reject_hdr("{,}", 4, "malformed header");
}

static void test_load_errors(void **state) {
  (void)state;
  char path[512], err[1024];
  npy_array a;
  tmp_path(path, sizeof path, "does_not_exist.npy");
  assert_int_equal(npy_load(path, &a, err, sizeof err), -1);
  assert_true(strncmp(err, path, strlen(path)) == 0);
  assert_non_null(strstr(err, "cannot open"));
  assert_null(a.data);

  /* messages of load start with the path */
  size_t len;
  unsigned char *b =
      make_npy(1, 0, "{'descr':'>f4','fortran_order':False,'shape':(2,)}", "12345678", 8, &len);
  tmp_path(path, sizeof path, "q.npy");
  write_file(path, b, len);
  free(b);
  assert_int_equal(npy_load(path, &a, err, sizeof err), -1);
  char want[700];
  snprintf(want, sizeof want,
           "%s: unsupported dtype '>f4' (expected little-endian <f4, <f2, <f8, <i4, <i8 or |u1)",
           path);
  assert_string_equal(err, want);

  /* truncated and trailing data, truncated header, bad magic via files */
  const char *h = "{'descr':'<i4','fortran_order':False,'shape':(3,)}";
  b = make_npy(1, 0, h, "\1\0\0\0\2\0\0\0\3\0\0\0\4", 13, &len);
  write_file(path, b, len);
  assert_int_equal(npy_load(path, &a, err, sizeof err), -1);
  assert_non_null(strstr(err, "trailing"));
  write_file(path, b, len - 2);
  assert_int_equal(npy_load(path, &a, err, sizeof err), -1);
  assert_non_null(strstr(err, "truncated data"));
  write_file(path, b, 30);
  assert_int_equal(npy_load(path, &a, err, sizeof err), -1);
  assert_non_null(strstr(err, "truncated header"));
  write_file(path, b, 5);
  assert_int_equal(npy_load(path, &a, err, sizeof err), -1);
  assert_non_null(strstr(err, "truncated"));
  write_file(path, b, len - 1);
  assert_int_equal(npy_load(path, &a, err, sizeof err), 0);
  assert_int_equal(((int32_t *)a.data)[2], 3);
  npy_free(&a);
  b[0] = 'x';
  write_file(path, b, len);
  assert_int_equal(npy_load(path, &a, err, sizeof err), -1);
  assert_true(strncmp(err, path, strlen(path)) == 0);
  assert_non_null(strstr(err, "bad magic"));
  free(b);
  write_file(path, "", 0);
  assert_int_equal(npy_load(path, &a, err, sizeof err), -1);
  assert_non_null(strstr(err, "truncated"));
  assert_int_equal(unlink(path), 0);

  /* a directory */
  assert_int_equal(npy_load(g_dir, &a, err, sizeof err), -1);
  assert_null(a.data);
  /* small and NULL error buffers */
  tmp_path(path, sizeof path, "does_not_exist.npy");
  char tiny[8];
  assert_int_equal(npy_load(path, &a, tiny, sizeof tiny), -1);
  assert_int_equal(strlen(tiny), sizeof tiny - 1);
  assert_int_equal(npy_load(path, &a, NULL, 0), -1);
  assert_int_equal(npy_load(path, &a, tiny, 0), -1);
}

static void test_save_errors(void **state) {
  (void)state;
  char path[512], err[1024];
  const int64_t neg[] = {2, -1}, big[] = {INT64_C(1) << 40, INT64_C(1) << 40};
  const int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  float v[4] = {0};
  tmp_path(path, sizeof path, "s.npy");
  assert_int_equal(npy_save(path, NPY_F32, 2, neg, v, err, sizeof err), -1);
  assert_non_null(strstr(err, "negative dimension"));
  assert_int_equal(npy_save(path, NPY_F32, 2, big, v, err, sizeof err), -1);
  assert_non_null(strstr(err, "overflow"));
  assert_int_equal(npy_save(path, NPY_F32, 9, nine, v, err, sizeof err), -1);
  assert_non_null(strstr(err, "ndim"));
  assert_int_equal(npy_save(path, NPY_F32, -1, nine, v, err, sizeof err), -1);
  assert_int_equal(npy_save(path, (npy_dtype)42, 1, nine, v, err, sizeof err), -1);
  assert_non_null(strstr(err, "dtype"));
  assert_int_equal(npy_save(path, NPY_F32, 1, nine, NULL, err, sizeof err), -1);
  assert_non_null(strstr(err, "data"));
  assert_int_equal(npy_save(path, NPY_F32, 1, NULL, v, err, sizeof err), -1);
  assert_non_null(strstr(err, "shape"));
  struct stat st;
  assert_int_not_equal(stat(path, &st), 0); /* nothing was written */
  tmp_path(path, sizeof path, "no/such/dir/s.npy");
  assert_int_equal(npy_save(path, NPY_F32, 1, nine, v, err, sizeof err), -1);
  assert_true(strncmp(err, path, strlen(path)) == 0);
  assert_non_null(strstr(err, "cannot open"));
  /* zero elements: data may be NULL */
  const int64_t z[] = {0, 3};
  tmp_path(path, sizeof path, "z.npy");
  assert_int_equal(npy_save(path, NPY_I64, 2, z, NULL, err, sizeof err), 0);
  npy_array a;
  assert_int_equal(npy_load(path, &a, err, sizeof err), 0);
  assert_int_equal(npy_numel(&a), 0);
  assert_non_null(a.data);
  npy_free(&a);
  assert_int_equal(unlink(path), 0);
}

/* ------------------------------------------------------------------------ */
/* misc API                                                                 */

static void test_misc(void **state) {
  (void)state;
  npy_array a;
  memset(&a, 0, sizeof a);
  npy_free(&a);
  npy_free(&a);
  npy_free(NULL);
  assert_int_equal(npy_numel(&a), 1); /* ndim 0 = scalar */
  assert_int_equal(npy_numel(NULL), 0);
  a.ndim = 2;
  a.shape[0] = 3;
  a.shape[1] = 4;
  assert_int_equal(npy_numel(&a), 12);
  a.shape[1] = 0;
  assert_int_equal(npy_numel(&a), 0);
  a.shape[1] = -1;
  assert_int_equal(npy_numel(&a), -1);
  a.ndim = 9;
  assert_int_equal(npy_numel(&a), -1);
  assert_int_equal(npy_dtype_size(NPY_F32), 4);
  assert_int_equal(npy_dtype_size(NPY_F16), 2);
  assert_int_equal(npy_dtype_size(NPY_F64), 8);
  assert_int_equal(npy_dtype_size(NPY_I32), 4);
  assert_int_equal(npy_dtype_size(NPY_I64), 8);
  assert_int_equal(npy_dtype_size(NPY_U8), 1);
  assert_int_equal(npy_dtype_size((npy_dtype)99), 0);
  assert_string_equal(npy_dtype_name(NPY_F32), "float32");
  assert_string_equal(npy_dtype_name(NPY_F16), "float16");
  assert_string_equal(npy_dtype_name(NPY_F64), "float64");
  assert_string_equal(npy_dtype_name(NPY_I32), "int32");
  assert_string_equal(npy_dtype_name(NPY_I64), "int64");
  assert_string_equal(npy_dtype_name(NPY_U8), "uint8");
  assert_string_equal(npy_dtype_name((npy_dtype)99), "invalid");
  char err[64];
  assert_int_equal(npy_parse("x", 1, NULL, err, sizeof err), -1);
  assert_int_equal(npy_parse(NULL, 5, &a, err, sizeof err), -1);
  assert_null(a.data);
}

/* ------------------------------------------------------------------------ */
/* conversions                                                              */

static npy_array mk(npy_dtype dt, int64_t n, const void *data) {
  npy_array a;
  memset(&a, 0, sizeof a);
  a.dtype = dt;
  a.ndim = 1;
  a.shape[0] = n;
  size_t nb = (size_t)n * npy_dtype_size(dt);
  a.data = malloc(nb ? nb : 1);
  assert_non_null(a.data);
  if (nb) memcpy(a.data, data, nb);
  return a;
}

static void test_conversions(void **state) {
  (void)state;
  char err[256];
  double *d;
  float *f;
  int32_t *i;

  const float f32v[4] = {1.5f, -2.0f, INFINITY, 3.0e-40f};
  npy_array a = mk(NPY_F32, 4, f32v);
  assert_int_equal(npy_to_f64(&a, &d, err, sizeof err), 0);
  for (int k = 0; k < 4; k++) assert_true(d[k] == (double)f32v[k]);
  free(d);
  assert_int_equal(npy_to_f32(&a, &f, err, sizeof err), 0);
  assert_memory_equal(f, f32v, sizeof f32v);
  free(f);
  i = (int32_t *)&err; /* must be reset to NULL on error */
  assert_int_equal(npy_to_i32(&a, &i, err, sizeof err), -1);
  assert_null(i);
  assert_non_null(strstr(err, "float"));
  npy_free(&a);

  const uint16_t f16v[5] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0xfc00};
  a = mk(NPY_F16, 5, f16v);
  assert_int_equal(npy_to_f32(&a, &f, err, sizeof err), 0);
  assert_true(f[0] == 1.0f && f[1] == -2.0f && f[2] == 65504.0f && f[3] == ldexpf(1, -24) &&
              f[4] == -INFINITY);
  free(f);
  assert_int_equal(npy_to_f64(&a, &d, err, sizeof err), 0);
  assert_true(d[2] == 65504.0 && d[3] == ldexp(1, -24));
  free(d);
  assert_int_equal(npy_to_i32(&a, &i, err, sizeof err), -1);
  npy_free(&a);

  const double f64v[6] = {0.1, -1e300, 1e-50, 3.4028235677973366e38, 3.4028235e38, NAN};
  a = mk(NPY_F64, 6, f64v);
  assert_int_equal(npy_to_f32(&a, &f, err, sizeof err), 0);
  assert_true(f[0] == 0.1f);
  assert_true(isinf(f[1]) && f[1] < 0);
  assert_true(f[2] == 0.0f);
  assert_true(isinf(f[3]) && f[3] > 0); /* exactly halfway above FLT_MAX: ties to inf */
  assert_true(f[4] == 3.4028235e38f);
  assert_true(isnan(f[5]));
  free(f);
  assert_int_equal(npy_to_f64(&a, &d, err, sizeof err), 0);
  assert_memory_equal(d, f64v, 5 * sizeof(double));
  free(d);
  assert_int_equal(npy_to_i32(&a, &i, err, sizeof err), -1);
  assert_non_null(strstr(err, "float64"));
  npy_free(&a);

  const int32_t i32v[3] = {INT32_MIN, 0, INT32_MAX};
  a = mk(NPY_I32, 3, i32v);
  assert_int_equal(npy_to_i32(&a, &i, err, sizeof err), 0);
  assert_memory_equal(i, i32v, sizeof i32v);
  free(i);
  assert_int_equal(npy_to_f64(&a, &d, err, sizeof err), 0);
  assert_true(d[0] == -2147483648.0 && d[2] == 2147483647.0);
  free(d);
  assert_int_equal(npy_to_f32(&a, &f, err, sizeof err), 0);
  assert_true(f[0] == -2147483648.0f);
  free(f);
  npy_free(&a);

  const int64_t i64v[4] = {-5, INT32_MAX, INT32_MIN, (INT64_C(1) << 53) + 1};
  a = mk(NPY_I64, 3, i64v);
  assert_int_equal(npy_to_i32(&a, &i, err, sizeof err), 0);
  assert_true(i[0] == -5 && i[1] == INT32_MAX && i[2] == INT32_MIN);
  free(i);
  npy_free(&a);
  a = mk(NPY_I64, 4, i64v);
  assert_int_equal(npy_to_i32(&a, &i, err, sizeof err), -1);
  assert_null(i);
  assert_non_null(strstr(err, "out of int32 range"));
  assert_non_null(strstr(err, "index 3"));
  assert_int_equal(npy_to_f64(&a, &d, err, sizeof err), 0);
  assert_true(d[0] == -5.0 && d[3] == 9007199254740992.0);
  free(d);
  npy_free(&a);
  const int64_t i64big = INT64_C(2147483648);
  a = mk(NPY_I64, 1, &i64big);
  assert_int_equal(npy_to_i32(&a, &i, err, sizeof err), -1);
  npy_free(&a);

  const uint8_t u8v[3] = {0, 128, 255};
  a = mk(NPY_U8, 3, u8v);
  assert_int_equal(npy_to_i32(&a, &i, err, sizeof err), 0);
  assert_true(i[0] == 0 && i[1] == 128 && i[2] == 255);
  free(i);
  assert_int_equal(npy_to_f32(&a, &f, err, sizeof err), 0);
  assert_true(f[2] == 255.0f);
  free(f);
  assert_int_equal(npy_to_f64(&a, &d, err, sizeof err), 0);
  assert_true(d[1] == 128.0);
  free(d);
  npy_free(&a);

  /* zero elements and scalars */
  a = mk(NPY_F32, 0, NULL);
  assert_int_equal(npy_to_f32(&a, &f, err, sizeof err), 0);
  assert_non_null(f);
  free(f);
  npy_free(&a);
  a = mk(NPY_I32, 1, i32v);
  a.ndim = 0;
  assert_int_equal(npy_to_i32(&a, &i, err, sizeof err), 0);
  assert_int_equal(i[0], INT32_MIN);
  free(i);
  npy_free(&a);

  /* invalid arguments */
  assert_int_equal(npy_to_f64(NULL, &d, err, sizeof err), -1);
  assert_int_equal(npy_to_f32(&a, NULL, err, sizeof err), -1);
  a.ndim = 1;
  a.shape[0] = 3; /* data NULL */
  assert_int_equal(npy_to_f32(&a, &f, err, sizeof err), -1);
  assert_null(f);
}

/* ------------------------------------------------------------------------ */
/* fp16 / bf16                                                              */

static uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Reference: round x to a grid of quantum q (power of two) with ties to even
 * in double precision, q depending on the binade; overflow above maxv. */
static float ref_round(float x, int mant_bits, int min_exp, double maxv) {
  if (isnan(x) || isinf(x) || x == 0.0f) return x;
  double ax = fabs((double)x);
  int e;
  frexp(ax, &e);            /* ax in [2^(e-1), 2^e) */
  int qe = (e - 1) - mant_bits;
  if (qe < min_exp - mant_bits) qe = min_exp - mant_bits; /* subnormal grid */
  double q = ldexp(1.0, qe);
  double r = nearbyint(ax / q) * q; /* current mode: to nearest even */
  if (r > maxv) r = INFINITY;
  return (float)copysign(r, (double)x);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rng(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state >> 16);
}

static void test_fp16_exhaustive(void **state) {
  (void)state;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = fp16_to_f32((uint16_t)h);
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    int s = (h >> 15) & 1;
    if (e == 31 && m) {
      assert_true(isnan(f));
      uint16_t back = fp16_from_f32(f);
      assert_true((back & 0x7c00) == 0x7c00 && (back & 0x3ff) != 0);
      assert_int_equal(back & 0x8000, h & 0x8000);
      continue;
    }
    double want = e == 31 ? INFINITY
                : e == 0 ? ldexp((double)m, -24)
                         : ldexp((double)(m + 1024), (int)e - 25);
    if (s) want = -want;
    if ((double)f != want) fail_msg("fp16_to_f32(0x%04x) = %a, want %a", h, (double)f, want);
    assert_int_equal(signbit(f) != 0, s);
    uint16_t back = fp16_from_f32(f);
    if (back != h) fail_msg("round trip 0x%04x -> %a -> 0x%04x", h, (double)f, back);
  }
}

static void test_fp16_special(void **state) {
  (void)state;
  assert_int_equal(fp16_from_f32(0.0f), 0x0000);
  assert_int_equal(fp16_from_f32(-0.0f), 0x8000);
  assert_int_equal(fp16_from_f32(1.0f), 0x3c00);
  assert_int_equal(fp16_from_f32(65504.0f), 0x7bff);
  assert_int_equal(fp16_from_f32(65519.996f), 0x7bff);
  assert_int_equal(fp16_from_f32(65520.0f), 0x7c00);
  assert_int_equal(fp16_from_f32(-1e10f), 0xfc00);
  assert_int_equal(fp16_from_f32(3.4e38f), 0x7c00);
  assert_int_equal(fp16_from_f32(INFINITY), 0x7c00);
  assert_int_equal(fp16_from_f32(-INFINITY), 0xfc00);
  uint16_t n = fp16_from_f32(NAN);
  assert_true((n & 0x7c00) == 0x7c00 && (n & 0x3ff));
  n = fp16_from_f32(u2f(0x7f800001)); /* signalling NaN, payload in low bits only */
  assert_true((n & 0x7c00) == 0x7c00 && (n & 0x3ff));
  n = fp16_from_f32(u2f(0xff800001));
  assert_true((n & 0xfc00) == 0xfc00 && (n & 0x3ff));
  assert_true(isnan(fp16_to_f32(0x7e00)));
  const float t24 = ldexpf(1, -24);
  assert_int_equal(fp16_from_f32(t24), 0x0001);
  assert_int_equal(fp16_from_f32(ldexpf(1, -25)), 0x0000);          /* tie -> even 0 */
  assert_int_equal(fp16_from_f32(nextafterf(ldexpf(1, -25), 1)), 0x0001);
  assert_int_equal(fp16_from_f32(-ldexpf(1, -26)), 0x8000);
  assert_int_equal(fp16_from_f32(1.5f * t24), 0x0002);              /* tie -> even 2 */
  assert_int_equal(fp16_from_f32(2.5f * t24), 0x0002);              /* tie -> even 2 */
  assert_int_equal(fp16_from_f32(1023.5f * t24), 0x0400);           /* carry into normal */
  assert_int_equal(fp16_from_f32(ldexpf(1, -14)), 0x0400);
  assert_int_equal(fp16_from_f32(1.0f + ldexpf(1, -11)), 0x3c00);   /* tie -> even */
  assert_int_equal(fp16_from_f32(1.0f + 3 * ldexpf(1, -11)), 0x3c02);
  assert_int_equal(fp16_from_f32(u2f(0x00000001)), 0x0000);         /* float subnormal */
  assert_int_equal(fp16_to_f32(0x0001), t24);
  assert_true(fp16_to_f32(0x7c00) == INFINITY);
  assert_true(fp16_to_f32(0xfc00) == -INFINITY);
}

static void test_fp16_random(void **state) {
  (void)state;
  assert_int_equal(fegetround(), FE_TONEAREST);
  for (int k = 0; k < 300000; k++) {
    uint32_t u = rng();
    if (k & 1) /* concentrate on the half range: exponents 95 .. 150 */
      u = (u & 0x807fffffu) | ((95u + (rng() % 56u)) << 23);
    float x = u2f(u);
    uint16_t h = fp16_from_f32(x);
    if (isnan(x)) {
      assert_true(isnan(fp16_to_f32(h)));
      continue;
    }
    float got = fp16_to_f32(h);
    float want = ref_round(x, 10, -14, 65504.0);
    if (f2u(got) != f2u(want))
      fail_msg("fp16(%a): got %a (0x%04x), want %a", (double)x, (double)got, h, (double)want);
  }
}

static void test_bf16(void **state) {
  (void)state;
  assert_int_equal(bf16_from_f32(1.0f), 0x3f80);
  assert_int_equal(bf16_from_f32(-0.0f), 0x8000);
  assert_int_equal(bf16_from_f32(INFINITY), 0x7f80);
  assert_int_equal(bf16_from_f32(3.4028235e38f), 0x7f80); /* FLT_MAX rounds to inf */
  assert_int_equal(bf16_from_f32(u2f(0x3f808000)), 0x3f80); /* tie -> even */
  assert_int_equal(bf16_from_f32(u2f(0x3f818000)), 0x3f82); /* tie -> even (up) */
  assert_int_equal(bf16_from_f32(u2f(0x3f808001)), 0x3f81);
  assert_true(isnan(bf16_to_f32(bf16_from_f32(NAN))));
  assert_true(isnan(bf16_to_f32(bf16_from_f32(u2f(0x7f800001)))));
  assert_true(isnan(bf16_to_f32(bf16_from_f32(u2f(0xffffffff)))));
  assert_true(bf16_to_f32(0x3f80) == 1.0f);
  /* exhaustive round trip */
  for (uint32_t b = 0; b < 65536; b++) {
    float f = bf16_to_f32((uint16_t)b);
    assert_int_equal(f2u(f), b << 16);
    if (isnan(f)) assert_true(isnan(bf16_to_f32(bf16_from_f32(f))));
    else assert_int_equal(bf16_from_f32(f), b);
  }
  for (int k = 0; k < 300000; k++) {
    float x = u2f(rng());
    uint16_t b = bf16_from_f32(x);
    if (isnan(x)) {
      assert_true(isnan(bf16_to_f32(b)));
      continue;
    }
    float want = ref_round(x, 7, -126, 0x1.fep127);
    if (f2u(bf16_to_f32(b)) != f2u(want))
      fail_msg("bf16(%a): got 0x%04x, want %a", (double)x, b, (double)want);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip_all),    cmocka_unit_test(test_save_header_text),
      cmocka_unit_test(test_parse_variants),   cmocka_unit_test(test_parse_data_copied),
      cmocka_unit_test(test_reject_preamble),  cmocka_unit_test(test_reject_header),
      cmocka_unit_test(test_load_errors),      cmocka_unit_test(test_save_errors),
      cmocka_unit_test(test_misc),             cmocka_unit_test(test_conversions),
      cmocka_unit_test(test_fp16_exhaustive),  cmocka_unit_test(test_fp16_special),
      cmocka_unit_test(test_fp16_random),      cmocka_unit_test(test_bf16),
  };
  return cmocka_run_group_tests_name("npy", tests, setup_dir, teardown_dir);
}
