/*
** GGUF block types, part 1: the 32-element blocks q4_0 q4_1 q5_0 q5_1 q8_0. The 256-element
** k-quants (q2_K q3_K q4_K q5_K q6_K q8_K) are in quant_k.c. Last, q6_0: tessera's own KV
** codec, no GGUF type (layout in core/kv/KV_CODECS.md, tests in core/tests/test_q6_0.c).
**
** Source of truth: ggml's block structs (ggml-common.h) and reference quantizers
** (quantize_row_*_ref in ggml-quants.c). Every quantizer repeats ggml's arithmetic step for
** step, so tessera writes the same bytes llama.cpp writes; core/tests/test_dtype.c pins bit
** layouts with hand-built blocks and pins the bytes with hashes taken from ggml itself.
** Round-trip bounds tested there (RMSE / RMS of N(0,1) input): q8_0 .0062, q8_K .0082,
** q6_K .021, q5_1 .044, q5_0 .05, q5_K .042, q4_1 .092, q4_0 .10, q4_K .084, q3_K .175, q2_K .345.
*/
#include <math.h>
#include <string.h>

#include "graph/quant_blocks.h"

/* A compiler that fuses a*b+c would change rounding and so the bytes we write. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* Value with the largest magnitude, sign kept (the first one on ties). */
static float signed_absmax(const float *x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; j++) {
    if (amax < fabsf(x[j])) {
      amax = fabsf(x[j]);
      max = x[j];
    }
  }
  return max;
}

static void min_max(const float *x, int n, float *lo, float *hi) {
  float mn = x[0], mx = x[0];
  for (int j = 1; j < n; j++) {
    if (x[j] < mn) mn = x[j];
    if (x[j] > mx) mx = x[j];
  }
  *lo = mn;
  *hi = mx;
}

/* ---- q4_0: x = d * (q - 8); element j in the low nibble of qs[j], j+16 in the high ---- */

void tsr_dequantize_row_q4_0(const void *src, float *dst, int64_t n) {
  const struct tsr_block_q4_0 *b = src;
  for (int64_t i = 0; i < n / TSR_QK4_0; i++, b++, dst += TSR_QK4_0) {
    float d = tsr_f16_to_f32(b->d);
    for (int j = 0; j < 16; j++) {
      dst[j] = (float)((b->qs[j] & 0x0f) - 8) * d;
      dst[j + 16] = (float)((b->qs[j] >> 4) - 8) * d;
    }
  }
}

void tsr_quantize_row_q4_0_ref(const float *src, void *dst, int64_t n) {
  struct tsr_block_q4_0 *b = dst;
  for (int64_t i = 0; i < n / TSR_QK4_0; i++, b++, src += TSR_QK4_0) {
    /* The extreme value maps to -8, the one level with no positive twin. */
    float d = signed_absmax(src, TSR_QK4_0) / -8;
    float id = d ? 1.0f / d : 0.0f;
    b->d = tsr_f32_to_f16(d);
    for (int j = 0; j < 16; j++) {
      int q0 = (int)(src[j] * id + 8.5f), q1 = (int)(src[j + 16] * id + 8.5f);
      if (q0 > 15) q0 = 15;
      if (q1 > 15) q1 = 15;
      b->qs[j] = (uint8_t)(q0 | (q1 << 4));
    }
  }
}

/* ---- q4_1: x = d * q + m ---- */

void tsr_dequantize_row_q4_1(const void *src, float *dst, int64_t n) {
  const struct tsr_block_q4_1 *b = src;
  for (int64_t i = 0; i < n / TSR_QK4_1; i++, b++, dst += TSR_QK4_1) {
    float d = tsr_f16_to_f32(b->d), m = tsr_f16_to_f32(b->m);
    for (int j = 0; j < 16; j++) {
      dst[j] = (float)(b->qs[j] & 0x0f) * d + m;
      dst[j + 16] = (float)(b->qs[j] >> 4) * d + m;
    }
  }
}

void tsr_quantize_row_q4_1_ref(const float *src, void *dst, int64_t n) {
  struct tsr_block_q4_1 *b = dst;
  for (int64_t i = 0; i < n / TSR_QK4_1; i++, b++, src += TSR_QK4_1) {
    float mn, mx;
    min_max(src, TSR_QK4_1, &mn, &mx);
    float d = (mx - mn) / 15;
    float id = d ? 1.0f / d : 0.0f;
    b->d = tsr_f32_to_f16(d);
    b->m = tsr_f32_to_f16(mn);
    for (int j = 0; j < 16; j++) {
      int q0 = (int)((src[j] - mn) * id + 0.5f), q1 = (int)((src[j + 16] - mn) * id + 0.5f);
      if (q0 > 15) q0 = 15;
      if (q1 > 15) q1 = 15;
      b->qs[j] = (uint8_t)(q0 | (q1 << 4));
    }
  }
}

/* ---- q5_0 / q5_1: four low bits as in q4, the fifth bit of element j is bit j of the
** little-endian 32-bit qh ---- */

static uint32_t qh_load(const uint8_t qh[4]) {
  return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

static void qh_store(uint8_t qh[4], uint32_t v) {
  for (int k = 0; k < 4; k++) qh[k] = (uint8_t)(v >> (8 * k));
}

/* Packs 32 five-bit codes into qs/qh. */
static void q5_pack(const int *q, uint8_t qs[16], uint8_t qh[4]) {
  uint32_t h = 0;
  for (int j = 0; j < 16; j++) {
    qs[j] = (uint8_t)((q[j] & 0x0f) | (q[j + 16] & 0x0f) << 4);
    h |= (uint32_t)((q[j] >> 4) & 1) << j;
    h |= (uint32_t)((q[j + 16] >> 4) & 1) << (j + 16);
  }
  qh_store(qh, h);
}

static void q5_unpack(const uint8_t qs[16], const uint8_t qh[4], int *q) {
  uint32_t h = qh_load(qh);
  for (int j = 0; j < 16; j++) {
    q[j] = (qs[j] & 0x0f) | (int)((h >> j) & 1) << 4;
    q[j + 16] = (qs[j] >> 4) | (int)((h >> (j + 16)) & 1) << 4;
  }
}

void tsr_dequantize_row_q5_0(const void *src, float *dst, int64_t n) {
  const struct tsr_block_q5_0 *b = src;
  int q[TSR_QK5_0];
  for (int64_t i = 0; i < n / TSR_QK5_0; i++, b++, dst += TSR_QK5_0) {
    float d = tsr_f16_to_f32(b->d);
    q5_unpack(b->qs, b->qh, q);
    for (int j = 0; j < TSR_QK5_0; j++) dst[j] = (float)(q[j] - 16) * d;
  }
}

void tsr_quantize_row_q5_0_ref(const float *src, void *dst, int64_t n) {
  struct tsr_block_q5_0 *b = dst;
  int q[TSR_QK5_0];
  for (int64_t i = 0; i < n / TSR_QK5_0; i++, b++, src += TSR_QK5_0) {
    float d = signed_absmax(src, TSR_QK5_0) / -16;
    float id = d ? 1.0f / d : 0.0f;
    b->d = tsr_f32_to_f16(d);
    for (int j = 0; j < TSR_QK5_0; j++) {
      q[j] = (int)(src[j] * id + 16.5f);
      if (q[j] > 31) q[j] = 31;
    }
    q5_pack(q, b->qs, b->qh);
  }
}

void tsr_dequantize_row_q5_1(const void *src, float *dst, int64_t n) {
  const struct tsr_block_q5_1 *b = src;
  int q[TSR_QK5_1];
  for (int64_t i = 0; i < n / TSR_QK5_1; i++, b++, dst += TSR_QK5_1) {
    float d = tsr_f16_to_f32(b->d), m = tsr_f16_to_f32(b->m);
    q5_unpack(b->qs, b->qh, q);
    for (int j = 0; j < TSR_QK5_1; j++) dst[j] = (float)q[j] * d + m;
  }
}

void tsr_quantize_row_q5_1_ref(const float *src, void *dst, int64_t n) {
  struct tsr_block_q5_1 *b = dst;
  int q[TSR_QK5_1];
  for (int64_t i = 0; i < n / TSR_QK5_1; i++, b++, src += TSR_QK5_1) {
    float mn, mx;
    min_max(src, TSR_QK5_1, &mn, &mx);
    float d = (mx - mn) / 31;
    float id = d ? 1.0f / d : 0.0f;
    b->d = tsr_f32_to_f16(d);
    b->m = tsr_f32_to_f16(mn);
    for (int j = 0; j < TSR_QK5_1; j++) {
      q[j] = (int)((src[j] - mn) * id + 0.5f);
      if (q[j] > 31) q[j] = 31;
    }
    q5_pack(q, b->qs, b->qh);
  }
}

/* ---- q8_0: x = d * q, q in [-127, 127] ---- */

void tsr_dequantize_row_q8_0(const void *src, float *dst, int64_t n) {
  const struct tsr_block_q8_0 *b = src;
  for (int64_t i = 0; i < n / TSR_QK8_0; i++, b++, dst += TSR_QK8_0) {
    float d = tsr_f16_to_f32(b->d);
    for (int j = 0; j < TSR_QK8_0; j++) dst[j] = (float)b->qs[j] * d;
  }
}

void tsr_quantize_row_q8_0_ref(const float *src, void *dst, int64_t n) {
  struct tsr_block_q8_0 *b = dst;
  for (int64_t i = 0; i < n / TSR_QK8_0; i++, b++, src += TSR_QK8_0) {
    float amax = 0.0f;
    for (int j = 0; j < TSR_QK8_0; j++) amax = fmaxf(amax, fabsf(src[j]));
    float d = amax / 127;
    float id = d ? 1.0f / d : 0.0f;
    b->d = tsr_f32_to_f16(d);
    /* roundf: halves away from zero, as ggml rounds here (not to even). */
    for (int j = 0; j < TSR_QK8_0; j++) b->qs[j] = (int8_t)roundf(src[j] * id);
  }
}

/* ---- q6_0 (tessera only): x = d * (q - 32), q in [0, 63] ----
** Bytes: d (f16) | ql[16]: the four low bits of element j in the low nibble of ql[j], of
** element j+16 in the high nibble (as q4_0) | qh[8]: the two high bits of elements j, j+8,
** j+16, j+24 in bits 0-1, 2-3, 4-5, 6-7 of qh[j]. 26 bytes per 32 values, 6.5 bits/value.
** The quantizer is q5_0's with 32 levels per side: the value of largest magnitude, sign kept,
** maps exactly to q = 0 (the level with no positive twin), so d = that value / -32. */

struct tsr_block_q6_0 {
  uint16_t d;
  uint8_t ql[TSR_QK6_0 / 2];
  uint8_t qh[TSR_QK6_0 / 4];
};
_Static_assert(sizeof(struct tsr_block_q6_0) == 26, "q6_0 layout");

void tsr_dequantize_row_q6_0(const void *src, float *dst, int64_t n) {
  const struct tsr_block_q6_0 *b = src;
  for (int64_t i = 0; i < n / TSR_QK6_0; i++, b++, dst += TSR_QK6_0) {
    float d = tsr_f16_to_f32(b->d);
    for (int j = 0; j < 8; j++) {
      const int h = b->qh[j];
      const int q0 = (b->ql[j] & 0x0f) | (h & 3) << 4;
      const int q1 = (b->ql[j + 8] & 0x0f) | (h >> 2 & 3) << 4;
      const int q2 = (b->ql[j] >> 4) | (h >> 4 & 3) << 4;
      const int q3 = (b->ql[j + 8] >> 4) | (h >> 6 & 3) << 4;
      dst[j] = (float)(q0 - 32) * d;
      dst[j + 8] = (float)(q1 - 32) * d;
      dst[j + 16] = (float)(q2 - 32) * d;
      dst[j + 24] = (float)(q3 - 32) * d;
    }
  }
}

void tsr_quantize_row_q6_0_ref(const float *src, void *dst, int64_t n) {
  struct tsr_block_q6_0 *b = dst;
  int q[TSR_QK6_0];
  for (int64_t i = 0; i < n / TSR_QK6_0; i++, b++, src += TSR_QK6_0) {
    /* an all-zero block gets d = +0, not the -0 that 0 / -32 is, so it decodes to +0 */
    const float m = signed_absmax(src, TSR_QK6_0);
    float d = m != 0.0f ? m / -32 : 0.0f;
    float id = d ? 1.0f / d : 0.0f;
    b->d = tsr_f32_to_f16(d);
    for (int j = 0; j < TSR_QK6_0; j++) {
      q[j] = (int)(src[j] * id + 32.5f); /* |src * id| <= 32: never negative */
      if (q[j] > 63) q[j] = 63;
    }
    for (int j = 0; j < 16; j++) b->ql[j] = (uint8_t)((q[j] & 0x0f) | (q[j + 16] & 0x0f) << 4);
    for (int j = 0; j < 8; j++)
      b->qh[j] = (uint8_t)((q[j] >> 4) | (q[j + 8] >> 4) << 2 | (q[j + 16] >> 4) << 4 |
                           (q[j + 24] >> 4) << 6);
  }
}
