/*
** Unpacking shared by the CPU's block-type dots (vec_quant.c on f32 vectors, vec_q8.c on
** 8-bit ones): the K types' packed scales, and (AVX2) nibble pairs and q5_0's and q5_1's
** codes as bytes, and the horizontal sum both take.
*/
#ifndef TSR_CPU_VEC_BLOCKS_H
#define TSR_CPU_VEC_BLOCKS_H

#include <stdint.h>
#include <string.h>

/* q4_K's sub-block j scale and min (6 bits each, packed in 12 bytes) */
static inline void tsr_k4_scale_min(const uint8_t s[12], int j, int *sc, int *m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0f) | (s[j - 4] >> 6) << 4;
    *m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define TSR_AVX2 __attribute__((target("avx2,fma,f16c")))

/* the sum of v's 8 lanes: (l0 + l4) + (l2 + l6), + ((l1 + l5) + (l3 + l7)) (vec_q8.c's
** reference sums its lanes in this order) */
TSR_AVX2 static inline float tsr_hsum8(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}

/* 16 bytes of nibble pairs as 32 byte codes: low nibbles first (elements 0..15), then
** the high ones (16..31), as q4_0, q5_0 and q4_K pack them */
TSR_AVX2 static inline __m256i tsr_nibbles32(const uint8_t *qs) {
  /* the 16 bytes in both halves, the high half shifted down a nibble */
  const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
  return _mm256_and_si256(_mm256_blend_epi32(b, _mm256_srli_epi16(b, 4), 0xf0),
                          _mm256_set1_epi8(0x0f));
}

/* q5_0 and q5_1: bit j of qh is element j's fifth bit: byte j 0xff where it is set */
TSR_AVX2 static inline __m256i tsr_fifth_mask(const uint8_t qh[4]) {
  uint32_t h;
  memcpy(&h, qh, 4);
  /* byte j of the result takes byte j/8 of h, then tests bit j%8 of it */
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32((int)h),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                       3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201ll);
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

/* q5_0's 32 codes minus 16, as signed bytes: a nibble n with its fifth bit is n, without it
** n - 16, which is n | 0xf0 */
TSR_AVX2 static inline __m256i tsr_q5_0_codes(const uint8_t qs[16], const uint8_t qh[4]) {
  return _mm256_or_si256(tsr_nibbles32(qs),
                         _mm256_andnot_si256(tsr_fifth_mask(qh), _mm256_set1_epi8((char)0xf0)));
}

/* q5_1's 32 codes, 0..31 */
TSR_AVX2 static inline __m256i tsr_q5_1_codes(const uint8_t qs[16], const uint8_t qh[4]) {
  return _mm256_or_si256(tsr_nibbles32(qs),
                         _mm256_and_si256(tsr_fifth_mask(qh), _mm256_set1_epi8(16)));
}
#endif

#endif
