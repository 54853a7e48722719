/*
 * fp16.h - host-side conversions between float32 and IEEE 754 binary16
 * (half) / bfloat16, as static inline functions. Portable C11: works on bit
 * patterns, independent of the FPU rounding mode and of F16C support.
 *
 * fp16_from_f32: round to nearest, ties to even; float32 values too small
 *   for a half become half subnormals or (signed) zero; |x| >= 65520 becomes
 *   +-inf; inf stays inf; NaN stays NaN (quiet, sign and top payload bits kept).
 * fp16_to_f32: exact (every half is a float32), subnormals included.
 * bf16_from_f32: round to nearest, ties to even (may round to +-inf);
 *   NaN stays NaN (quiet, sign and top payload bits kept).
 * bf16_to_f32: exact.
 */
#ifndef CLNSA_UTIL_FP16_H
#define CLNSA_UTIL_FP16_H

#include <stdint.h>
#include <string.h>

static inline uint32_t fp16_f32_bits_(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float fp16_bits_f32_(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline uint16_t fp16_from_f32(float f) {
  const uint32_t x = fp16_f32_bits_(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;

  if (ax >= 0x7f800000u) {                  /* inf or NaN */
    if (ax == 0x7f800000u) return (uint16_t)(sign | 0x7c00u);
    return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  }
  if (ax >= 0x477ff000u)                    /* >= 65520: rounds to inf */
    return (uint16_t)(sign | 0x7c00u);
  if (ax >= 0x38800000u) {                  /* >= 2^-14: normal half */
    uint32_t h = (ax - 0x38000000u) >> 13;  /* rebias exponent 127 -> 15 */
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);            /* carry may reach the exponent */
  }
  /* Subnormal half (or zero): value = mant * 2^(e-150), unit 2^-24. */
  {
    const uint32_t e = ax >> 23;
    uint32_t shift, mant, h, rem, half;
    if (e < 102u) return (uint16_t)sign;    /* < 2^-25: rounds to zero */
    shift = 126u - e;                       /* 14 .. 24 */
    mant = (ax & 0x7fffffu) | 0x800000u;
    h = mant >> shift;
    rem = mant & ((1u << shift) - 1u);
    half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u))) h++;
    return (uint16_t)(sign | h);            /* h may become 0x400 (normal) */
  }
}

static inline float fp16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0) {
    if (m == 0) return fp16_bits_f32_(sign);
    e = 113;                                /* normalise the subnormal */
    while (!(m & 0x400u)) { m <<= 1; e--; }
    m &= 0x3ffu;
    return fp16_bits_f32_(sign | (e << 23) | (m << 13));
  }
  if (e == 31) return fp16_bits_f32_(sign | 0x7f800000u | (m << 13));
  return fp16_bits_f32_(sign | ((e + 112u) << 23) | (m << 13));
}

static inline uint16_t bf16_from_f32(float f) {
  const uint32_t x = fp16_f32_bits_(f);
  if ((x & 0x7fffffffu) > 0x7f800000u)      /* NaN: keep NaN, make quiet */
    return (uint16_t)((x >> 16) | 0x40u);
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static inline float bf16_to_f32(uint16_t b) {
  return fp16_bits_f32_((uint32_t)b << 16);
}

#endif /* CLNSA_UTIL_FP16_H */
