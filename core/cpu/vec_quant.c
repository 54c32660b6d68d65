/*
** Dots of a quantized (or bf16) weight row with an f32 vector, the codes expanded to f32 in
** registers and multiplied there (AVX2+FMA): no dequantized copy of the row is written
** or read back, so a decode step reads each weight byte once. Products and sums are f32
** as the dequantize-then-dot path's are; only their order differs. Machines without
** AVX2 get no kernel, and mat_mul dequantizes as before.
*/
#include "vec.h"

#include <string.h>

#include "graph/dtype.h"
#include "graph/quant_blocks.h"
#include "vec_blocks.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))

/* the 8 signed bytes at the bottom of v as f32 */
AVX2 static inline __m256 i8x8(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

/* sum_i q[i]*y[i] over 16 signed byte codes, added to s */
AVX2 static inline __m256 dot16_i8(__m128i q, const float *y, __m256 s) {
  s = _mm256_fmadd_ps(i8x8(q), _mm256_loadu_ps(y), s);
  return _mm256_fmadd_ps(i8x8(_mm_srli_si128(q, 8)), _mm256_loadu_ps(y + 8), s);
}

/* sum_i q[i]*y[i] over 32 signed byte codes */
AVX2 static inline __m256 dot32_i8(__m256i q, const float *y) {
  const __m256 s = dot16_i8(_mm256_castsi256_si128(q), y, _mm256_setzero_ps());
  return dot16_i8(_mm256_extracti128_si256(q, 1), y + 16, s);
}

/* sum of y over 32 values */
AVX2 static inline __m256 sum32(const float *y) {
  return _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(y), _mm256_loadu_ps(y + 8)),
                       _mm256_add_ps(_mm256_loadu_ps(y + 16), _mm256_loadu_ps(y + 24)));
}

AVX2 static float dot_q8_0(const void *w, const float *y, int64_t n) {
  const struct tsr_block_q8_0 *b = w;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / TSR_QK8_0; i++, b++, y += TSR_QK8_0) {
    const __m256 s = dot32_i8(_mm256_loadu_si256((const __m256i *)b->qs), y);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(tsr_f16_to_f32(b->d)), s, acc);
  }
  return tsr_hsum8(acc);
}

AVX2 static float dot_q4_0(const void *w, const float *y, int64_t n) {
  const struct tsr_block_q4_0 *b = w;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / TSR_QK4_0; i++, b++, y += TSR_QK4_0) {
    const __m256i q = _mm256_sub_epi8(tsr_nibbles32(b->qs), _mm256_set1_epi8(8));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(tsr_f16_to_f32(b->d)), dot32_i8(q, y), acc);
  }
  return tsr_hsum8(acc);
}

AVX2 static float dot_q5_0(const void *w, const float *y, int64_t n) {
  const struct tsr_block_q5_0 *b = w;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / TSR_QK5_0; i++, b++, y += TSR_QK5_0) {
    const __m256i q = tsr_q5_0_codes(b->qs, b->qh);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(tsr_f16_to_f32(b->d)), dot32_i8(q, y), acc);
  }
  return tsr_hsum8(acc);
}

/* q4_1 and q5_1: value = d q + m, so the dot is d sum(q y) + m sum(y) */
AVX2 static float dot_q4_1(const void *w, const float *y, int64_t n) {
  const struct tsr_block_q4_1 *b = w;
  __m256 acc = _mm256_setzero_ps(), offs = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / TSR_QK4_1; i++, b++, y += TSR_QK4_1) {
    acc = _mm256_fmadd_ps(_mm256_set1_ps(tsr_f16_to_f32(b->d)), dot32_i8(tsr_nibbles32(b->qs), y),
                          acc);
    offs = _mm256_fmadd_ps(_mm256_set1_ps(tsr_f16_to_f32(b->m)), sum32(y), offs);
  }
  return tsr_hsum8(_mm256_add_ps(acc, offs));
}

AVX2 static float dot_q5_1(const void *w, const float *y, int64_t n) {
  const struct tsr_block_q5_1 *b = w;
  __m256 acc = _mm256_setzero_ps(), offs = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / TSR_QK5_1; i++, b++, y += TSR_QK5_1) {
    const __m256i q = tsr_q5_1_codes(b->qs, b->qh);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(tsr_f16_to_f32(b->d)), dot32_i8(q, y), acc);
    offs = _mm256_fmadd_ps(_mm256_set1_ps(tsr_f16_to_f32(b->m)), sum32(y), offs);
  }
  return tsr_hsum8(_mm256_add_ps(acc, offs));
}

/* q4_K and q5_K: sub-blocks 2c and 2c + 1 (codes lo and hi, 32 each) of a super-block
** with scales s, into the products (acc) and the mins' share (mins) */
AVX2 static inline void k4_pair(const uint8_t s[12], int c, float d, float dmin, __m256i lo,
                                __m256i hi, const float *y, __m256 *acc, __m256 *mins) {
  int sc0, m0, sc1, m1;
  tsr_k4_scale_min(s, 2 * c, &sc0, &m0);
  tsr_k4_scale_min(s, 2 * c + 1, &sc1, &m1);
  *acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)sc0), dot32_i8(lo, y), *acc);
  *acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)sc1), dot32_i8(hi, y + 32), *acc);
  *mins = _mm256_fmadd_ps(_mm256_set1_ps(dmin * (float)m0), sum32(y), *mins);
  *mins = _mm256_fmadd_ps(_mm256_set1_ps(dmin * (float)m1), sum32(y + 32), *mins);
}

/* q4_K: value = d sc q - dmin m per sub-block of 32; sub-blocks 2c and 2c + 1 are the low
** and high nibbles of qs[32c .. 32c + 31] */
AVX2 static float dot_q4_K(const void *w, const float *y, int64_t n) {
  const struct tsr_block_q4_K *b = w;
  __m256 acc = _mm256_setzero_ps(), mins = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  for (int64_t i = 0; i < n / TSR_QK_K; i++, b++) {
    const float d = tsr_f16_to_f32(b->d), dmin = tsr_f16_to_f32(b->dmin);
    for (int c = 0; c < 4; c++, y += 64) {
      const __m256i raw = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * c));
      const __m256i lo = _mm256_and_si256(raw, m4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      k4_pair(b->scales, c, d, dmin, lo, hi, y, &acc, &mins);
    }
  }
  return tsr_hsum8(_mm256_sub_ps(acc, mins));
}

/* q5_K: as q4_K, each code's fifth bit in qh: element 32 j + l (sub-block j) has it at
** bit j of qh[l] */
AVX2 static float dot_q5_K(const void *w, const float *y, int64_t n) {
  const struct tsr_block_q5_K *b = w;
  __m256 acc = _mm256_setzero_ps(), mins = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
  for (int64_t i = 0; i < n / TSR_QK_K; i++, b++) {
    const float d = tsr_f16_to_f32(b->d), dmin = tsr_f16_to_f32(b->dmin);
    const __m256i qh = _mm256_loadu_si256((const __m256i *)b->qh);
    for (int c = 0; c < 4; c++, y += 64) {
      const __m256i raw = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * c));
      const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one);
      const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one);
      const __m256i lo = _mm256_or_si256(_mm256_and_si256(raw, m4), _mm256_slli_epi16(h0, 4));
      const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4),
                                         _mm256_slli_epi16(h1, 4));
      k4_pair(b->scales, c, d, dmin, lo, hi, y, &acc, &mins);
    }
  }
  return tsr_hsum8(_mm256_sub_ps(acc, mins));
}

/* bf16: the top half of an f32 */
AVX2 static float dot_bf16(const void *w, const float *y, int64_t n) {
  const uint16_t *x = w;
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i)));
    acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(u, 16)), _mm256_loadu_ps(y + i),
                          acc);
  }
  float s = tsr_hsum8(acc);
  for (; i < n; i++) s += tsr_bf16_to_f32(x[i]) * y[i];
  return s;
}

/* q6_K: value = d sc (q - 32) per 16 values; in each half h (128 values) element
** 128h + 32k + l has its low nibble in ql[64h + l + 32(k & 1)] (low for k < 2, high
** after) and its top two bits at bits 2k of qh[32h + l] */
AVX2 static float dot_q6_K(const void *w, const float *y, int64_t n) {
  const struct tsr_block_q6_K *b = w;
  __m256 acc = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
  for (int64_t i = 0; i < n / TSR_QK_K; i++, b++) {
    const float d = tsr_f16_to_f32(b->d);
    for (int h = 0; h < 2; h++) {
      const __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
      for (int k = 0; k < 4; k++, y += 32) {
        const __m256i ql =
            _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32 * (k & 1)));
        const __m256i lo = _mm256_and_si256(k < 2 ? ql : _mm256_srli_epi16(ql, 4), m4);
        const __m256i top = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), m2);
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(top, 4)),
                                          _mm256_set1_epi8(32));
        const int8_t *sc = b->scales + 8 * h + 2 * k; /* elements 16 apart */
        const __m256 s0 = dot16_i8(_mm256_castsi256_si128(q), y, _mm256_setzero_ps());
        const __m256 s1 = dot16_i8(_mm256_extracti128_si256(q, 1), y + 16, _mm256_setzero_ps());
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)sc[0]), s0, acc);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)sc[1]), s1, acc);
      }
    }
  }
  return tsr_hsum8(acc);
}

tsr_vec_dot_row_fn tsr_vec_dot_row(int dtype) {
  if (!tsr_cpu_has_avx2()) return NULL;
  switch (dtype) {
  case TSR_Q8_0: return dot_q8_0;
  case TSR_Q4_0: return dot_q4_0;
  case TSR_Q4_1: return dot_q4_1;
  case TSR_Q5_0: return dot_q5_0;
  case TSR_Q5_1: return dot_q5_1;
  case TSR_Q4_K: return dot_q4_K;
  case TSR_Q5_K: return dot_q5_K;
  case TSR_Q6_K: return dot_q6_K;
  case TSR_BF16: return dot_bf16;
  default: return NULL;
  }
}
#else
tsr_vec_dot_row_fn tsr_vec_dot_row(int dtype) {
  (void)dtype;
  return NULL;
}
#endif
