/*
** Weight rows dotted with columns quantized to 8 bits (the cpu backend's `activations: q8`):
** a column becomes blocks of 32 int8 codes q with a scale d (x ~ d q) once per product, and
** each 32 values of a row meet a block in integers: the sum over 4 adjacent values of code
** x code is exact, then multiplied by the row's scale for those values and d into 8 f32
** lanes (lane k: values 4k..4k+3 of each block), which are summed at the end in one fixed
** tree; an offset (q4_1's and q5_1's m, the K types' mins) times d meets the block's code
** sum in one more f32 chain. The portable reference computes every step in that order, so
** the AVX2 and AVX-512 VNNI kernels equal it bit for bit (core/tests/test_vec_q8.c); each
** machine runs the widest it has, the reference where it has neither.
*/
#include "vec.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "graph/dtype.h"
#include "graph/quant_blocks.h"
#include "vec_blocks.h"

/* ---- the vector ------------------------------------------------------------------------ */

/* a block's scale: amax / 127; a block holding NaN or an infinity gets codes 0 and scale NaN,
** so every dot that meets it is NaN, as the f32 dot would be */
static void finish_block(float amax, bool finite, const int32_t *codes, struct tsr_q8_act *a) {
  int32_t sum = 0;
  for (int i = 0; i < TSR_Q8_ACT_BLOCK; i++) {
    a->q[i] = finite ? (int8_t)codes[i] : 0;
    sum += a->q[i];
  }
  int32_t half[2] = {0, 0};
  for (int k = 0; k < 8; k++) {
    a->nsum4[k] = -(a->q[4 * k] + a->q[4 * k + 1] + a->q[4 * k + 2] + a->q[4 * k + 3]);
    half[k / 4] -= a->nsum4[k];
  }
  a->d = finite ? amax / 127.0f : NAN;
  a->sumf = (float)sum; /* exact: |sum| <= 32 x 127 */
  a->sum16[0] = (float)half[0], a->sum16[1] = (float)half[1];
}

/* 127 / amax, or 0 where amax is 0 or so small that the quotient overflows (every code 0) */
static float inverse_step(float amax) {
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  return id <= 3.40282347e38f ? id : 0.0f;
}

void tsr_vec_quantize_q8_ref(const float *x, int64_t n, struct tsr_q8_act *out) {
  for (int64_t b = 0; b < n / TSR_Q8_ACT_BLOCK; b++, x += TSR_Q8_ACT_BLOCK) {
    float amax = 0.0f;
    bool finite = true;
    for (int i = 0; i < TSR_Q8_ACT_BLOCK; i++) {
      finite &= isfinite(x[i]);
      amax = fmaxf(amax, fabsf(x[i]));
    }
    const float id = inverse_step(amax);
    int32_t codes[TSR_Q8_ACT_BLOCK];
    for (int i = 0; i < TSR_Q8_ACT_BLOCK; i++) codes[i] = finite ? (int32_t)lrintf(x[i] * id) : 0;
    finish_block(amax, finite, codes, &out[b]);
  }
}

/* ---- the reference dot ------------------------------------------------------------------ */

/* 32 values (sub-block j) of a row as the integer dot sees them: codes c, the row's scale of
** each lane of 4 values, and the offset: value = scale c + offs */
struct sub32 {
  int32_t c[32];
  float scale[8];
  float offs, offs2; /* q2_K: offs for values 0-15, offs2 for 16-31 */
};

static void scales_all(struct sub32 *s, float v) {
  for (int k = 0; k < 8; k++) s->scale[k] = v;
}

static bool has_offset(int dtype) {
  return dtype == TSR_Q4_1 || dtype == TSR_Q5_1 || dtype == TSR_Q2_K || dtype == TSR_Q4_K ||
         dtype == TSR_Q5_K;
}

/* the low nibble of qs[l] is value l, the high one value l + 16 (q4_0, q4_1, q5_0, q5_1) */
static int nibble_of(const uint8_t *qs, int l) { return l < 16 ? qs[l] & 15 : qs[l - 16] >> 4; }

static int fifth_bit(const uint8_t qh[4], int l) { return (qh[l / 8] >> (l % 8) & 1) << 4; }

static void expand(int dtype, const void *w, int64_t j, struct sub32 *s) {
  s->offs = s->offs2 = 0.0f;
  switch (dtype) {
  case TSR_Q8_0: {
    const struct tsr_block_q8_0 *b = (const struct tsr_block_q8_0 *)w + j;
    for (int l = 0; l < 32; l++) s->c[l] = b->qs[l];
    scales_all(s, tsr_f16_to_f32(b->d));
    break;
  }
  case TSR_Q4_0: {
    const struct tsr_block_q4_0 *b = (const struct tsr_block_q4_0 *)w + j;
    for (int l = 0; l < 32; l++) s->c[l] = nibble_of(b->qs, l) - 8;
    scales_all(s, tsr_f16_to_f32(b->d));
    break;
  }
  case TSR_Q4_1: {
    const struct tsr_block_q4_1 *b = (const struct tsr_block_q4_1 *)w + j;
    for (int l = 0; l < 32; l++) s->c[l] = nibble_of(b->qs, l);
    scales_all(s, tsr_f16_to_f32(b->d));
    s->offs = tsr_f16_to_f32(b->m);
    break;
  }
  case TSR_Q5_0: {
    const struct tsr_block_q5_0 *b = (const struct tsr_block_q5_0 *)w + j;
    for (int l = 0; l < 32; l++) s->c[l] = (nibble_of(b->qs, l) | fifth_bit(b->qh, l)) - 16;
    scales_all(s, tsr_f16_to_f32(b->d));
    break;
  }
  case TSR_Q5_1: {
    const struct tsr_block_q5_1 *b = (const struct tsr_block_q5_1 *)w + j;
    for (int l = 0; l < 32; l++) s->c[l] = nibble_of(b->qs, l) | fifth_bit(b->qh, l);
    scales_all(s, tsr_f16_to_f32(b->d));
    s->offs = tsr_f16_to_f32(b->m);
    break;
  }
  case TSR_Q4_K:
  case TSR_Q5_K: { /* sub-block j: the low (j even) or high nibbles of qs[32 (j / 2) ..] */
    const bool five = dtype == TSR_Q5_K;
    const struct tsr_block_q4_K *b4 = (const struct tsr_block_q4_K *)w + j / 8;
    const struct tsr_block_q5_K *b5 = (const struct tsr_block_q5_K *)w + j / 8;
    const uint8_t *qs = (five ? b5->qs : b4->qs) + 32 * (j % 8 / 2);
    const int sub = (int)(j % 8);
    for (int l = 0; l < 32; l++) {
      s->c[l] = sub % 2 ? qs[l] >> 4 : qs[l] & 15;
      if (five) s->c[l] |= (b5->qh[l] >> sub & 1) << 4;
    }
    int sc, m;
    tsr_k4_scale_min(five ? b5->scales : b4->scales, sub, &sc, &m);
    const float d = tsr_f16_to_f32(five ? b5->d : b4->d);
    const float dmin = tsr_f16_to_f32(five ? b5->dmin : b4->dmin);
    scales_all(s, d * (float)sc);
    s->offs = -(dmin * (float)m);
    break;
  }
  case TSR_Q2_K: { /* sub-block j: bits 2 (j % 4) of qs[32 (j % 8 / 4) + l]; a scale and a min
                    ** a 16 values */
    const struct tsr_block_q2_K *b = (const struct tsr_block_q2_K *)w + j / 8;
    const int sub = (int)(j % 8);
    for (int l = 0; l < 32; l++) s->c[l] = b->qs[32 * (sub / 4) + l] >> (2 * (sub % 4)) & 3;
    const float d = tsr_f16_to_f32(b->d), dmin = tsr_f16_to_f32(b->dmin);
    for (int q = 0; q < 8; q++) s->scale[q] = d * (float)(b->scales[2 * sub + q / 4] & 15);
    s->offs = -(dmin * (float)(b->scales[2 * sub] >> 4));
    s->offs2 = -(dmin * (float)(b->scales[2 * sub + 1] >> 4));
    break;
  }
  case TSR_Q3_K: { /* sub-block j: bits 2 (j % 4) of qs[32 (j % 8 / 4) + l], bit j % 8 of
                    ** hmask[l] the third (clear: minus 4); a scale a 16 values */
    const struct tsr_block_q3_K *b = (const struct tsr_block_q3_K *)w + j / 8;
    const int sub = (int)(j % 8);
    for (int l = 0; l < 32; l++) {
      const int low = b->qs[32 * (sub / 4) + l] >> (2 * (sub % 4)) & 3;
      s->c[l] = (low | (b->hmask[l] >> sub & 1) << 2) - 4;
    }
    const float d = tsr_f16_to_f32(b->d);
    for (int q = 0; q < 8; q++) s->scale[q] = d * (float)tsr_q3_K_scale(b->scales, 2 * sub + q / 4);
    break;
  }
  case TSR_Q6_K: { /* sub-block j: half h = j / 4, k = j % 4 (value 128 h + 32 k + l) */
    const struct tsr_block_q6_K *b = (const struct tsr_block_q6_K *)w + j / 8;
    const int h = (int)(j % 8 / 4), k = (int)(j % 4);
    for (int l = 0; l < 32; l++) {
      const uint8_t ql = b->ql[64 * h + l + 32 * (k & 1)];
      const int lo = k < 2 ? ql & 15 : ql >> 4, top = b->qh[32 * h + l] >> (2 * k) & 3;
      s->c[l] = (lo | top << 4) - 32;
    }
    const float d = tsr_f16_to_f32(b->d);
    for (int q = 0; q < 8; q++) s->scale[q] = d * (float)b->scales[8 * h + 2 * k + q / 4];
    break;
  }
  }
}

/* the 8 lanes' sum in the order the AVX2 kernels' horizontal sum takes */
static float lanes_sum(const float l[8]) {
  const float a0 = l[0] + l[4], a1 = l[1] + l[5], a2 = l[2] + l[6], a3 = l[3] + l[7];
  return (a0 + a2) + (a1 + a3);
}

/* A column's offset chain over one block (OFFSET 1): the block's offset times the codes' sum;
** (OFFSET 2, q2_K) each half's offset times its codes' sum, the first half first */
#define OFF_STEP(OFFSET, off, o0, o1, q)                                                       \
  ((OFFSET) == 2 ? fmaf((o1) * (q)->d, (q)->sum16[1], fmaf((o0) * (q)->d, (q)->sum16[0], off)) \
                 : fmaf((o0) * (q)->d, (q)->sumf, off))

float tsr_vec_dot_q8_ref(int dtype, const void *w, const struct tsr_q8_act *a, int64_t n) {
  float lane[8] = {0}, off = 0.0f;
  struct sub32 s = {0};
  for (int64_t j = 0; j < n / TSR_Q8_ACT_BLOCK; j++, a++) {
    expand(dtype, w, j, &s);
    for (int k = 0; k < 8; k++) {
      const int32_t isum = s.c[4 * k] * a->q[4 * k] + s.c[4 * k + 1] * a->q[4 * k + 1] +
                           s.c[4 * k + 2] * a->q[4 * k + 2] + s.c[4 * k + 3] * a->q[4 * k + 3];
      lane[k] = fmaf(s.scale[k] * a->d, (float)isum, lane[k]);
    }
    off = dtype == TSR_Q2_K ? OFF_STEP(2, off, s.offs, s.offs2, a) : OFF_STEP(1, off, s.offs, 0, a);
  }
  return has_offset(dtype) ? lanes_sum(lane) + off : lanes_sum(lane);
}


/* ---- AVX2 ------------------------------------------------------------------------------- */

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))

/* How far ahead of the block it reads a kernel over rows as stored asks for the rows' next
** bytes, into L2 (prefetcht1); the rows of a product lie end to end, so this runs on into the
** next rows. Hardware prefetchers did not keep up with decode's streams on a Sapphire Rapids
** VM (q5_0 rows at 6.7 GB/s of a 19 GB/s streaming read). Asked for a block at a time, 2 KB
** ahead, decode there went 2.0x faster on Qwen2.5-Coder 0.5B and 2.4x on Coder 1.5B; asked
** for a call's rows at once before the call, 25% less (the requests queued up). A macro:
** GCC dropped _mm_prefetch inlined into these target("...") functions. */
#define AHEAD 2048
#define ahead(block) __builtin_prefetch((const char *)(block) + AHEAD, 0, 2)
/* the values of one block of a type, for the bytes of 32 of them */
#define VALUES_q8_0 32
#define VALUES_q4_0 32
#define VALUES_q4_1 32
#define VALUES_q5_0 32
#define VALUES_q5_1 32
#define VALUES_q2_K 256
#define VALUES_q3_K 256
#define VALUES_q4_K 256
#define VALUES_q5_K 256
#define VALUES_q6_K 256
#define BYTES32(T) (sizeof(struct tsr_block_##T) * TSR_Q8_ACT_BLOCK / VALUES_##T)

AVX2 static void quantize_avx2(const float *x, int64_t n, struct tsr_q8_act *out) {
  const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(3.40282347e38f);
  for (int64_t b = 0; b < n / TSR_Q8_ACT_BLOCK; b++, x += TSR_Q8_ACT_BLOCK) {
    __m256 v[4], amax = _mm256_setzero_ps(), ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    for (int i = 0; i < 4; i++) {
      v[i] = _mm256_loadu_ps(x + 8 * i);
      const __m256 a = _mm256_andnot_ps(sign, v[i]);
      amax = _mm256_max_ps(amax, a);
      ok = _mm256_and_ps(ok, _mm256_cmp_ps(a, big, _CMP_LE_OQ)); /* false for NaN, inf */
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    const float am = _mm_cvtss_f32(m);
    const bool finite = _mm256_movemask_ps(ok) == 0xff;
    const __m256 id = _mm256_set1_ps(inverse_step(am));
    /* finish_block in registers: the codes (0 for a block that is not finite) packed to
    ** bytes, the sums of each 4 (two horizontal adds) and of all 32; both packing and adding
    ** leave the four-value groups in the order 0 2 4 6 1 3 5 7, put back by one permute */
    const __m256i keep = finite ? _mm256_set1_epi32(-1) : _mm256_setzero_si256();
    __m256i c[4];
    for (int i = 0; i < 4; i++)
      c[i] = _mm256_and_si256(_mm256_cvtps_epi32(_mm256_mul_ps(v[i], id)), keep);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i sum4 = _mm256_permutevar8x32_epi32(
        _mm256_hadd_epi32(_mm256_hadd_epi32(c[0], c[1]), _mm256_hadd_epi32(c[2], c[3])), order);
    const __m256i bytes = _mm256_permutevar8x32_epi32(
        _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3])), order);
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(sum4), _mm256_extracti128_si256(sum4, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
    struct tsr_q8_act *a = &out[b];
    _mm256_storeu_si256((__m256i *)a->q, bytes);
    _mm256_storeu_si256((__m256i *)a->nsum4, _mm256_sub_epi32(_mm256_setzero_si256(), sum4));
    const __m128i halves = _mm_hadd_epi32(
        _mm_hadd_epi32(_mm256_castsi256_si128(sum4), _mm256_extracti128_si256(sum4, 1)),
        _mm_setzero_si128()); /* codes 0-15, 16-31 */
    a->d = finite ? am / 127.0f : NAN;
    a->sumf = (float)_mm_cvtsi128_si32(t); /* exact: |sum| <= 32 x 127 */
    a->sum16[0] = (float)_mm_cvtsi128_si32(halves);
    a->sum16[1] = (float)_mm_extract_epi32(halves, 1);
  }
}

/* Each type's 32 values j of a row: their codes, each lane's scale and the offset. */
AVX2 static inline void blk_q8_0(const void *w, int64_t j, __m256i *c, __m256 *sv, float *offs) {
  const struct tsr_block_q8_0 *b = (const struct tsr_block_q8_0 *)w + j;
  *c = _mm256_loadu_si256((const __m256i *)b->qs);
  *sv = _mm256_set1_ps(_cvtsh_ss(b->d)), *offs = 0.0f;
}

AVX2 static inline void blk_q4_0(const void *w, int64_t j, __m256i *c, __m256 *sv, float *offs) {
  const struct tsr_block_q4_0 *b = (const struct tsr_block_q4_0 *)w + j;
  *c = _mm256_sub_epi8(tsr_nibbles32(b->qs), _mm256_set1_epi8(8));
  *sv = _mm256_set1_ps(_cvtsh_ss(b->d)), *offs = 0.0f;
}

AVX2 static inline void blk_q5_0(const void *w, int64_t j, __m256i *c, __m256 *sv, float *offs) {
  const struct tsr_block_q5_0 *b = (const struct tsr_block_q5_0 *)w + j;
  *c = tsr_q5_0_codes(b->qs, b->qh);
  *sv = _mm256_set1_ps(_cvtsh_ss(b->d)), *offs = 0.0f;
}

AVX2 static inline void blk_q4_1(const void *w, int64_t j, __m256i *c, __m256 *sv, float *offs) {
  const struct tsr_block_q4_1 *b = (const struct tsr_block_q4_1 *)w + j;
  *c = tsr_nibbles32(b->qs);
  *sv = _mm256_set1_ps(_cvtsh_ss(b->d)), *offs = _cvtsh_ss(b->m);
}

AVX2 static inline void blk_q5_1(const void *w, int64_t j, __m256i *c, __m256 *sv, float *offs) {
  const struct tsr_block_q5_1 *b = (const struct tsr_block_q5_1 *)w + j;
  *c = tsr_q5_1_codes(b->qs, b->qh);
  *sv = _mm256_set1_ps(_cvtsh_ss(b->d)), *offs = _cvtsh_ss(b->m);
}

/* q4_K and q5_K: sub-block j % 8 is the low (even) or high (odd) nibbles of qs[32 (j % 8 / 2)
** ..], q5_K's fifth bits at bit j % 8 of qh[l] */
AVX2 static inline void blk_k4(const uint8_t *qs, const uint8_t *qh, const uint8_t scales[12],
                               uint16_t d, uint16_t dmin, int sub, __m256i *c, __m256 *sv,
                               float *offs) {
  const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * (sub / 2)));
  *c = _mm256_and_si256(sub % 2 ? _mm256_srli_epi16(raw, 4) : raw, _mm256_set1_epi8(0x0f));
  if (qh) {
    const __m256i h = _mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)qh), sub);
    *c = _mm256_or_si256(*c, _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(1)), 4));
  }
  int sc, m;
  tsr_k4_scale_min(scales, sub, &sc, &m);
  *sv = _mm256_set1_ps(_cvtsh_ss(d) * (float)sc);
  *offs = -(_cvtsh_ss(dmin) * (float)m);
}

AVX2 static inline void blk_q4_K(const void *w, int64_t j, __m256i *c, __m256 *sv, float *offs) {
  const struct tsr_block_q4_K *b = (const struct tsr_block_q4_K *)w + j / 8;
  blk_k4(b->qs, NULL, b->scales, b->d, b->dmin, (int)(j % 8), c, sv, offs);
}

AVX2 static inline void blk_q5_K(const void *w, int64_t j, __m256i *c, __m256 *sv, float *offs) {
  const struct tsr_block_q5_K *b = (const struct tsr_block_q5_K *)w + j / 8;
  blk_k4(b->qs, b->qh, b->scales, b->d, b->dmin, (int)(j % 8), c, sv, offs);
}

/* q2_K: sub-block j % 8's two bits from qs; the scales of its two 16 values on lanes 0-3 and
** 4-7, and their offsets */
AVX2 static inline void blk_q2_K(const void *w, int64_t j, __m256i *c, __m256 *sv, float *offs) {
  const struct tsr_block_q2_K *b = (const struct tsr_block_q2_K *)w + j / 8;
  const int sub = (int)(j % 8);
  const __m256i qs = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * (sub / 4)));
  *c = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * (sub % 4)), _mm256_set1_epi8(3));
  const float d = _cvtsh_ss(b->d), dmin = _cvtsh_ss(b->dmin);
  const int s0 = b->scales[2 * sub], s1 = b->scales[2 * sub + 1];
  *sv = _mm256_setr_m128(_mm_set1_ps(d * (float)(s0 & 15)), _mm_set1_ps(d * (float)(s1 & 15)));
  offs[0] = -(dmin * (float)(s0 >> 4)), offs[1] = -(dmin * (float)(s1 >> 4));
}

/* q3_K: sub-block j % 8's two bits from qs and third from hmask, codes minus 4; the scales
** of its two 16 values on lanes 0-3 and 4-7 */
AVX2 static inline void blk_q3_K(const void *w, int64_t j, __m256i *c, __m256 *sv, float *offs) {
  const struct tsr_block_q3_K *b = (const struct tsr_block_q3_K *)w + j / 8;
  const int sub = (int)(j % 8);
  const __m256i qs = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * (sub / 4)));
  const __m256i low = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * (sub % 4)), _mm256_set1_epi8(3));
  const __m256i third = _mm256_and_si256(
      _mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)b->hmask), sub), _mm256_set1_epi8(1));
  *c = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(third, 2)), _mm256_set1_epi8(4));
  const float d = _cvtsh_ss(b->d);
  *sv = _mm256_setr_m128(_mm_set1_ps(d * (float)tsr_q3_K_scale(b->scales, 2 * sub)),
                         _mm_set1_ps(d * (float)tsr_q3_K_scale(b->scales, 2 * sub + 1)));
  *offs = 0.0f;
}

/* q6_K: sub-block (h, k) = (j % 8 / 4, j % 4), scales of 16 values on lanes 0-3 and 4-7 */
AVX2 static inline void blk_q6_K(const void *w, int64_t j, __m256i *c, __m256 *sv, float *offs) {
  const struct tsr_block_q6_K *b = (const struct tsr_block_q6_K *)w + j / 8;
  const int h = (int)(j % 8 / 4), k = (int)(j % 4);
  const __m256i ql = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32 * (k & 1)));
  const __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
  const __m256i lo = _mm256_and_si256(k < 2 ? ql : _mm256_srli_epi16(ql, 4), _mm256_set1_epi8(15));
  const __m256i top = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), _mm256_set1_epi8(3));
  *c = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(top, 4)), _mm256_set1_epi8(32));
  const float d = _cvtsh_ss(b->d);
  const int8_t *sc = b->scales + 8 * h + 2 * k;
  *sv = _mm256_setr_m128(_mm_set1_ps(d * (float)sc[0]), _mm_set1_ps(d * (float)sc[1]));
  *offs = 0.0f;
}

/* AVX2's kernel of a type: each 32 values of a row expanded once and met by every column,
** each column in its own lanes and offset chain (so one column's result is the same whatever
** columns are with it); the codes' sign moved onto the columns' codes where SIGNED (the
** 16-bit pair sums of maddubs never saturate: |code| <= 128, |y| <= 127). The lanes' scale
** times d is a lane-wise product: the reference's scalar product in every lane. */
#define AVX2_KERNEL(T, SIGNED, OFFSET)                                                        \
  AVX2 static inline __attribute__((always_inline)) void row_avx2_##T(                        \
      const void *w, const struct tsr_q8_act *const *a, const int nc, int64_t n, float *out) { \
    __m256 acc[TSR_Q8_COLS];                                                                  \
    float off[TSR_Q8_COLS];                                                                   \
    for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps(), off[c] = 0.0f;                 \
    for (int64_t j = 0; j < n / TSR_Q8_ACT_BLOCK; j++) {                                      \
      __m256i codes;                                                                          \
      __m256 sv;                                                                              \
      float offs[2];                                                                          \
      ahead((const char *)w + j * BYTES32(T));                                                \
      blk_##T(w, j, &codes, &sv, offs);                                                       \
      const __m256i u = SIGNED ? _mm256_abs_epi8(codes) : codes;                              \
      for (int c = 0; c < nc; c++) {                                                          \
        const struct tsr_q8_act *q = a[c] + j;                                                \
        __m256i y = _mm256_loadu_si256((const __m256i *)q->q);                                \
        if (SIGNED) y = _mm256_sign_epi8(y, codes);                                           \
        const __m256i isum =                                                                  \
            _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), _mm256_set1_epi16(1));              \
        acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(sv, _mm256_set1_ps(q->d)),                     \
                                 _mm256_cvtepi32_ps(isum), acc[c]);                           \
        if (OFFSET) off[c] = OFF_STEP(OFFSET, off[c], offs[0], offs[1], q);                   \
      }                                                                                       \
    }                                                                                         \
    for (int c = 0; c < nc; c++)                                                              \
      out[c] = OFFSET ? tsr_hsum8(acc[c]) + off[c] : tsr_hsum8(acc[c]);                       \
  }                                                                                           \
  /* one body a column count, so the columns' sums stay in registers */                      \
  AVX2 static void avx2_##T(const void *const *w, int nr, const struct tsr_q8_act *const *a,  \
                            int nc, int64_t n, float *out) {                                  \
    for (int r = 0; r < nr; r++, out += nc) switch (nc) {                                     \
      case 1: row_avx2_##T(w[r], a, 1, n, out); break;                                        \
      case 2: row_avx2_##T(w[r], a, 2, n, out); break;                                        \
      case 3: row_avx2_##T(w[r], a, 3, n, out); break;                                        \
      case 4: row_avx2_##T(w[r], a, 4, n, out); break;                                        \
      case 5: row_avx2_##T(w[r], a, 5, n, out); break;                                        \
      case 6: row_avx2_##T(w[r], a, 6, n, out); break;                                        \
      case 7: row_avx2_##T(w[r], a, 7, n, out); break;                                        \
      default: row_avx2_##T(w[r], a, 8, n, out);                                              \
      }                                                                                       \
  }

/* AVX-512 VNNI's kernel: two rows at a time against every column. vpdpbusd sums 4 products
** of unsigned and signed bytes into an int32 lane in one instruction, so a signed type's
** codes c are met as c + BIAS (unsigned) and the lane starts from -BIAS times the column's 4
** codes' sum (its nsum4, shifted): the same exact integer. A type with an offset (q4_1, q5_1,
** the K types) takes one row at a time: its columns' offset chains and lanes then fit the
** registers. */
#define VNNI_KERNEL(T, LOG2_BIAS, OFFSET)                                                     \
  VNNI_KERNEL_ON(T, blk_##T, 1, LOG2_BIAS, OFFSET, BYTES32(T))
/* BYTES: of 32 values of a row as stored, which the kernel asks for ahead (0: rows expanded) */
#define VNNI_KERNEL_ON(T, BLK, ADD_BIAS, LOG2_BIAS, OFFSET, BYTES)                            \
  VNNI static inline __attribute__((always_inline)) void rows_vnni_##T(                       \
      const void *const *w, const int nr, const struct tsr_q8_act *const *a, const int nc,    \
      int64_t n, float *out) {                                                                \
    __m256 acc[2][TSR_Q8_COLS];                                                               \
    float off[TSR_Q8_COLS];                                                                   \
    for (int c = 0; c < nc; c++) {                                                            \
      off[c] = 0.0f;                                                                          \
      for (int r = 0; r < nr; r++) acc[r][c] = _mm256_setzero_ps();                           \
    }                                                                                         \
    for (int64_t j = 0; j < n / TSR_Q8_ACT_BLOCK; j++) {                                      \
      __m256i u[2];                                                                           \
      __m256 sv[2];                                                                           \
      float offs[2][2];                                                                       \
      for (int r = 0; r < nr; r++) {                                                          \
        if (BYTES) ahead((const char *)w[r] + j * (BYTES));                                   \
        BLK(w[r], j, &u[r], &sv[r], offs[r]);                                                 \
        if (ADD_BIAS && LOG2_BIAS >= 0)                                                       \
          u[r] = _mm256_add_epi8(u[r], _mm256_set1_epi8((char)(1 << (LOG2_BIAS & 7))));        \
        /* hidden from the compiler as a broadcast, so each product below is one vmulps */    \
        __asm__("" : "+v"(sv[r]));                                                            \
      }                                                                                       \
      for (int c = 0; c < nc; c++) {                                                          \
        const struct tsr_q8_act *q = a[c] + j;                                                \
        const __m256i y = _mm256_loadu_si256((const __m256i *)q->q);                          \
        const __m256i start =                                                                 \
            LOG2_BIAS >= 0                                                                    \
                ? _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)q->nsum4), LOG2_BIAS) \
                : _mm256_setzero_si256();                                                     \
        const __m256 d = _mm256_set1_ps(q->d);                                                \
        for (int r = 0; r < nr; r++)                                                          \
          acc[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(sv[r], d),                                \
                                      _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(start, u[r], y)), \
                                      acc[r][c]);                                             \
        if (OFFSET) off[c] = OFF_STEP(OFFSET, off[c], offs[0][0], offs[0][1], q);             \
      }                                                                                       \
    }                                                                                         \
    for (int r = 0; r < nr; r++)                                                              \
      for (int c = 0; c < nc; c++)                                                            \
        out[r * nc + c] = OFFSET ? tsr_hsum8(acc[r][c]) + off[c] : tsr_hsum8(acc[r][c]);      \
  }                                                                                           \
  /* one body a row and column count, so the sums stay in registers */                       \
  VNNI static void vnni_##T(const void *const *w, int nr, const struct tsr_q8_act *const *a,  \
                            int nc, int64_t n, float *out) {                                  \
    /* two rows at once even for one column: two chains of adds hide each other's latency \
    ** (the rows' bytes are asked for ahead) */                                            \
    if (!OFFSET)                                                                              \
      for (; nr > 1; nr -= 2, w += 2, out += 2 * nc) BY_COLS(rows_vnni_##T, w, 2, a, nc, n, out); \
    for (; nr > 0; nr--, w++, out += nc) BY_COLS(rows_vnni_##T, w, 1, a, nc, n, out);         \
  }
#define BY_COLS(F, w, NR, a, nc, n, out)                                                      \
  switch (nc) {                                                                               \
  case 1: F(w, NR, a, 1, n, out); break;                                                      \
  case 2: F(w, NR, a, 2, n, out); break;                                                      \
  case 3: F(w, NR, a, 3, n, out); break;                                                      \
  case 4: F(w, NR, a, 4, n, out); break;                                                      \
  case 5: F(w, NR, a, 5, n, out); break;                                                      \
  case 6: F(w, NR, a, 6, n, out); break;                                                      \
  case 7: F(w, NR, a, 7, n, out); break;                                                      \
  default: F(w, NR, a, 8, n, out);                                                            \
  }
#define VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))

/* SIGNED and the bias that makes a signed type's codes unsigned (log2; -1: none) */
#define BLOCK_TYPES(X)                                                                        \
  X(q8_0, 1, 7, 0)                                                                            \
  X(q4_0, 1, 3, 0)                                                                            \
  X(q5_0, 1, 4, 0)                                                                            \
  X(q4_1, 0, -1, 1)                                                                           \
  X(q5_1, 0, -1, 1)
#define K_TYPES(X)                                                                            \
  X(q2_K, 0, -1, 2)                                                                           \
  X(q3_K, 1, 2, 0)                                                                            \
  X(q4_K, 0, -1, 1)                                                                           \
  X(q5_K, 0, -1, 1)                                                                           \
  X(q6_K, 1, 5, 0)
#define ALL_TYPES(X) BLOCK_TYPES(X) K_TYPES(X)
#define AVX2_OF(T, SIGNED, LOG2_BIAS, OFFSET) AVX2_KERNEL(T, SIGNED, OFFSET)
#define VNNI_OF(T, SIGNED, LOG2_BIAS, OFFSET) VNNI_KERNEL(T, LOG2_BIAS, OFFSET)
ALL_TYPES(AVX2_OF)
BLOCK_TYPES(VNNI_OF) /* the K types' VNNI kernels go a super-block at a time (below) */

/* A q4_K or q5_K super-block's 8 scales d sc and offsets -(dmin m), each the product blk_k4
** forms, the 6-bit sc and m unpacked from the 12 bytes four at a time in 32-bit words */
AVX2 static inline void k4_scales(const uint8_t s[12], float d, float dmin, float scale[8],
                                  float offset[8]) {
  uint32_t u[3];
  memcpy(u, s, sizeof u);
  const uint32_t sc_lo = u[0] & 0x3f3f3f3f, m_lo = u[1] & 0x3f3f3f3f;
  const uint32_t sc_hi = (u[2] & 0x0f0f0f0f) | ((u[0] >> 6) & 0x03030303) << 4;
  const uint32_t m_hi = ((u[2] >> 4) & 0x0f0f0f0f) | ((u[1] >> 6) & 0x03030303) << 4;
  const __m256 sc =
      _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_setr_epi32((int)sc_lo, (int)sc_hi, 0, 0)));
  const __m256 m =
      _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_setr_epi32((int)m_lo, (int)m_hi, 0, 0)));
  _mm256_storeu_ps(scale, _mm256_mul_ps(_mm256_set1_ps(d), sc));
  /* the sign flipped as unary minus flips it (0 - x would turn -0 into +0) */
  _mm256_storeu_ps(offset, _mm256_xor_ps(_mm256_mul_ps(_mm256_set1_ps(dmin), m),
                                         _mm256_set1_ps(-0.0f)));
}

/* q4_K and q5_K a super-block at a time: its scales and offsets formed once (k4_scales), each
** 32 bytes of codes (and q5_K's fifth bits) loaded once for the two sub-blocks they hold.
** Every lane's arithmetic is blk_k4's in the same order (the block kernels'), so the sums are
** the same bits, with fewer instructions a block. */
#define VNNI_K4_KERNEL(T, HAS_QH, QH)                                                         \
  VNNI static inline __attribute__((always_inline)) void row_vnni_sb_##T(                     \
      const void *const *w, const int nr, const struct tsr_q8_act *const *a, const int nc,    \
      int64_t n, float *out) {                                                                \
    (void)nr; /* one row: BY_COLS's shape */                                                  \
    __m256 acc[TSR_Q8_COLS];                                                                  \
    float off[TSR_Q8_COLS];                                                                   \
    for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps(), off[c] = 0.0f;                 \
    const struct tsr_block_##T *b = w[0];                                                     \
    for (int64_t s = 0; s < n / TSR_QK_K; s++, b++) {                                         \
      for (size_t o = 0; o < sizeof *b; o += 64) ahead((const char *)b + o);                  \
      float scale[8], offset[8];                                                              \
      k4_scales(b->scales, _cvtsh_ss(b->d), _cvtsh_ss(b->dmin), scale, offset);               \
      for (int p = 0; p < 4; p++) {                                                           \
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * p));            \
        for (int half = 0; half < 2; half++) {                                                \
          const int sub = 2 * p + half;                                                       \
          __m256i u = _mm256_and_si256(half ? _mm256_srli_epi16(raw, 4) : raw,                \
                                       _mm256_set1_epi8(0x0f));                               \
          if (HAS_QH) {                                                                       \
            const __m256i h = _mm256_srli_epi16(                                              \
                _mm256_loadu_si256((const __m256i *)(QH)), sub);                              \
            u = _mm256_or_si256(u, _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(1)), \
                                                     4));                                     \
          }                                                                                   \
          __m256 sv = _mm256_set1_ps(scale[sub]);                                             \
          const float offs = offset[sub];                                                     \
          __asm__("" : "+v"(sv));                                                             \
          for (int c = 0; c < nc; c++) {                                                      \
            const struct tsr_q8_act *q = a[c] + 8 * s + sub;                                  \
            const __m256i y = _mm256_loadu_si256((const __m256i *)q->q);                      \
            acc[c] = _mm256_fmadd_ps(                                                         \
                _mm256_mul_ps(sv, _mm256_set1_ps(q->d)),                                      \
                _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u, y)), acc[c]); \
            off[c] = fmaf(offs * q->d, q->sumf, off[c]);                                      \
          }                                                                                   \
        }                                                                                     \
      }                                                                                       \
    }                                                                                         \
    for (int c = 0; c < nc; c++) out[c] = tsr_hsum8(acc[c]) + off[c];                         \
  }                                                                                           \
  VNNI static void vnni_##T(const void *const *w, int nr, const struct tsr_q8_act *const *a,  \
                            int nc, int64_t n, float *out) {                                  \
    for (; nr > 0; nr--, w++, out += nc) BY_COLS(row_vnni_sb_##T, w, 1, a, nc, n, out);       \
  }
VNNI_K4_KERNEL(q4_K, 0, NULL)
VNNI_K4_KERNEL(q5_K, 1, b->qh)

/* q2_K's 16 scales d sc and offsets -(dmin m) and q3_K's 16 scales d (sc - 32), each the
** product blk_q2_K and blk_q3_K form; q3_K's 6-bit scales gathered four at a time in 32-bit
** words (low nibbles of j < 8 from bytes 0-7, of j >= 8 from their high nibbles; the top two
** bits of j from bits 2 (j / 4) of byte 8 + j % 4) */
/* out[i] = d (codes[i] - minus), its sign flipped where sign is -0 (as unary minus flips it) */
AVX2 static inline void k16_products(__m128i codes, __m256i minus, float d, float sign,
                                     float *out) {
  for (int i = 0; i < 2; i++, codes = _mm_srli_si128(codes, 8))
    _mm256_storeu_ps(out + 8 * i,
                     _mm256_xor_ps(_mm256_mul_ps(_mm256_set1_ps(d),
                                                 _mm256_cvtepi32_ps(_mm256_sub_epi32(
                                                     _mm256_cvtepu8_epi32(codes), minus))),
                                   _mm256_set1_ps(sign)));
}
AVX2 static inline void q2_scales(const uint8_t s[16], float d, float dmin, float scale[16],
                                  float offset[16]) {
  const __m128i b = _mm_loadu_si128((const __m128i *)s), nibble = _mm_set1_epi8(15);
  k16_products(_mm_and_si128(b, nibble), _mm256_setzero_si256(), d, 0.0f, scale);
  k16_products(_mm_and_si128(_mm_srli_epi16(b, 4), nibble), _mm256_setzero_si256(), dmin, -0.0f,
               offset);
}
AVX2 static inline void q3_scales(const uint8_t s[12], float d, float scale[16]) {
  uint32_t u[3];
  memcpy(u, s, sizeof u);
  const uint32_t lo = 0x0f0f0f0f, top = 0x03030303;
  const __m128i codes = _mm_setr_epi32((int)((u[0] & lo) | (u[2] & top) << 4),
                                       (int)((u[1] & lo) | (u[2] >> 2 & top) << 4),
                                       (int)((u[0] >> 4 & lo) | (u[2] >> 4 & top) << 4),
                                       (int)((u[1] >> 4 & lo) | (u[2] >> 6 & top) << 4));
  k16_products(codes, _mm256_set1_epi32(32), d, 0.0f, scale);
}

/* q2_K and q3_K a super-block at a time (one or two rows): the scales (and q2_K's offsets)
** formed once, each 32 bytes of qs (and q3_K's hmask) loaded once for the sub-blocks they
** hold; q3_K's codes met biased by 4 (the 3-bit code itself) from the column's nsum4. Every
** lane's arithmetic is the block kernels' over blk_q2_K and blk_q3_K, in the same order: the
** same bits. */
#define VNNI_K23_KERNEL(T, THREE)                                                             \
  VNNI static inline __attribute__((always_inline)) void rows_vnni_sb_##T(                    \
      const void *const *w, const int nr, const struct tsr_q8_act *const *a, const int nc,    \
      int64_t n, float *out) {                                                                \
    __m256 acc[2][TSR_Q8_COLS];                                                               \
    float off[2][TSR_Q8_COLS];                                                                \
    for (int r = 0; r < nr; r++)                                                              \
      for (int c = 0; c < nc; c++) acc[r][c] = _mm256_setzero_ps(), off[r][c] = 0.0f;         \
    for (int64_t s = 0; s < n / TSR_QK_K; s++) {                                              \
      const struct tsr_block_##T *b[2];                                                       \
      float scale[2][16], offset[2][16];                                                      \
      __m256i hm[2];                                                                          \
      for (int r = 0; r < nr; r++) {                                                          \
        b[r] = (const struct tsr_block_##T *)w[r] + s;                                        \
        for (size_t o = 0; o < sizeof *b[r]; o += 64) ahead((const char *)b[r] + o);          \
        hm[r] = _mm256_setzero_si256();                                                       \
        superblock_##T(b[r], scale[r], offset[r], &hm[r]);                                    \
      }                                                                                       \
      for (int half = 0; half < 2; half++) {                                                  \
        __m256i qs[2];                                                                        \
        for (int r = 0; r < nr; r++)                                                          \
          qs[r] = _mm256_loadu_si256((const __m256i *)(b[r]->qs + 32 * half));                \
        for (int k = 0; k < 4; k++) {                                                         \
          const int sub = 4 * half + k;                                                       \
          __m256i u[2];                                                                       \
          __m256 sv[2];                                                                       \
          for (int r = 0; r < nr; r++) {                                                      \
            u[r] = _mm256_and_si256(_mm256_srli_epi16(qs[r], 2 * k), _mm256_set1_epi8(3));    \
            if (THREE)                                                                        \
              u[r] = _mm256_or_si256(                                                         \
                  u[r], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm[r], sub),     \
                                                           _mm256_set1_epi8(1)), 2));         \
            sv[r] = _mm256_setr_m128(_mm_set1_ps(scale[r][2 * sub]),                          \
                                     _mm_set1_ps(scale[r][2 * sub + 1]));                     \
            __asm__("" : "+v"(sv[r]));                                                        \
          }                                                                                   \
          for (int c = 0; c < nc; c++) {                                                      \
            const struct tsr_q8_act *q = a[c] + 8 * s + sub;                                  \
            const __m256i y = _mm256_loadu_si256((const __m256i *)q->q);                      \
            const __m256i start =                                                             \
                THREE ? _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)q->nsum4), 2)   \
                      : _mm256_setzero_si256();                                               \
            const __m256 d = _mm256_set1_ps(q->d);                                            \
            for (int r = 0; r < nr; r++) {                                                    \
              acc[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(sv[r], d),                            \
                                          _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(start, u[r], y)),\
                                          acc[r][c]);                                         \
              if (!THREE)                                                                     \
                off[r][c] =                                                                   \
                    OFF_STEP(2, off[r][c], offset[r][2 * sub], offset[r][2 * sub + 1], q);    \
            }                                                                                 \
          }                                                                                   \
        }                                                                                     \
      }                                                                                       \
    }                                                                                         \
    for (int r = 0; r < nr; r++)                                                              \
      for (int c = 0; c < nc; c++)                                                            \
        out[r * nc + c] = THREE ? tsr_hsum8(acc[r][c]) : tsr_hsum8(acc[r][c]) + off[r][c];    \
  }                                                                                           \
  VNNI static void vnni_##T(const void *const *w, int nr, const struct tsr_q8_act *const *a,  \
                            int nc, int64_t n, float *out) {                                  \
    /* q2_K's rows two at a time (their offset chains then overlap: decode 1.2x), q3_K's one \
    ** at a time (two were 15% slower) */                                                     \
    for (; !THREE && nr > 1; nr -= 2, w += 2, out += 2 * nc)                                  \
      BY_COLS(rows_vnni_sb_##T, w, 2, a, nc, n, out);                                         \
    for (; nr > 0; nr--, w++, out += nc) BY_COLS(rows_vnni_sb_##T, w, 1, a, nc, n, out);      \
  }
/* what a super-block gives its sub-blocks: scales, q2_K's offsets, q3_K's third bits */
AVX2 static inline void superblock_q2_K(const struct tsr_block_q2_K *b, float scale[16],
                                        float offset[16], __m256i *hm) {
  (void)hm;
  q2_scales(b->scales, _cvtsh_ss(b->d), _cvtsh_ss(b->dmin), scale, offset);
}
AVX2 static inline void superblock_q3_K(const struct tsr_block_q3_K *b, float scale[16],
                                        float offset[16], __m256i *hm) {
  (void)offset;
  q3_scales(b->scales, _cvtsh_ss(b->d), scale);
  *hm = _mm256_loadu_si256((const __m256i *)b->hmask);
}
VNNI_K23_KERNEL(q2_K, 0)
VNNI_K23_KERNEL(q3_K, 1)

/* q6_K a super-block at a time, as the K4 kernels above: d read once, each half's fifth and
** sixth bits loaded once for its four sub-blocks; the codes met biased by 32 (the 6-bit
** code itself) from the column's nsum4, as the block kernels meet them, so the sums are the same
** bits. */
VNNI static inline __attribute__((always_inline)) void row_vnni_sb_q6_K(
    const void *const *w, const int nr, const struct tsr_q8_act *const *a, const int nc,
    int64_t n, float *out) {
  (void)nr; /* one row: BY_COLS's shape */
  __m256 acc[TSR_Q8_COLS];
  for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
  const struct tsr_block_q6_K *b = w[0];
  for (int64_t s = 0; s < n / TSR_QK_K; s++, b++) {
    for (size_t o = 0; o < sizeof *b; o += 64) ahead((const char *)b + o);
    const float d = _cvtsh_ss(b->d);
    for (int h = 0; h < 2; h++) {
      const __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
      for (int k = 0; k < 4; k++) {
        const int sub = 4 * h + k;
        const __m256i ql = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32 * (k & 1)));
        const __m256i lo = _mm256_and_si256(k < 2 ? ql : _mm256_srli_epi16(ql, 4),
                                            _mm256_set1_epi8(15));
        const __m256i top = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), _mm256_set1_epi8(3));
        const __m256i u = _mm256_or_si256(lo, _mm256_slli_epi16(top, 4));
        const int8_t *sc = b->scales + 8 * h + 2 * k;
        __m256 sv = _mm256_setr_m128(_mm_set1_ps(d * (float)sc[0]), _mm_set1_ps(d * (float)sc[1]));
        __asm__("" : "+v"(sv));
        for (int c = 0; c < nc; c++) {
          const struct tsr_q8_act *q = a[c] + 8 * s + sub;
          const __m256i y = _mm256_loadu_si256((const __m256i *)q->q);
          const __m256i start = _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)q->nsum4), 5);
          acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(sv, _mm256_set1_ps(q->d)),
                                   _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(start, u, y)), acc[c]);
        }
      }
    }
  }
  for (int c = 0; c < nc; c++) out[c] = tsr_hsum8(acc[c]);
}

VNNI static void vnni_q6_K(const void *const *w, int nr, const struct tsr_q8_act *const *a,
                           int nc, int64_t n, float *out) {
  for (; nr > 0; nr--, w++, out += nc) BY_COLS(row_vnni_sb_q6_K, w, 1, a, nc, n, out);
}

/* Rows expanded once for many columns: a block's codes as vnni's kernel meets them (biased),
** its lanes' two scales and its offset. The kernel over them is vnni's with the expansion
** read back, so each block meets its columns exactly as above. */
VNNI static inline void blk_x(const void *w, int64_t j, __m256i *u, __m256 *sv, float *offs) {
  const struct tsr_q8_xblock *b = (const struct tsr_q8_xblock *)w + j;
  *u = _mm256_loadu_si256((const __m256i *)b->u);
  *sv = _mm256_setr_m128(_mm_set1_ps(b->s[0]), _mm_set1_ps(b->s[1]));
  offs[0] = b->offs, offs[1] = b->offs2;
}
#define VNNI_X_OF(T, SIGNED, LOG2_BIAS, OFFSET)                                               \
  VNNI_KERNEL_ON(x_##T, blk_x, 0, LOG2_BIAS, OFFSET, 0)                                       \
  VNNI static void expand_##T(const void *w, int64_t n, struct tsr_q8_xblock *out) {          \
    for (int64_t j = 0; j < n / TSR_Q8_ACT_BLOCK; j++) {                                      \
      __m256i u;                                                                              \
      __m256 sv;                                                                              \
      float offs[2] = {0.0f, 0.0f}, lanes[8];                                                 \
      blk_##T(w, j, &u, &sv, offs);                                                           \
      if (LOG2_BIAS >= 0) u = _mm256_add_epi8(u, _mm256_set1_epi8((char)(1 << (LOG2_BIAS & 7)))); \
      _mm256_storeu_si256((__m256i *)out[j].u, u);                                            \
      _mm256_storeu_ps(lanes, sv);                                                            \
      out[j].s[0] = lanes[0], out[j].s[1] = lanes[4];                                         \
      out[j].offs = offs[0], out[j].offs2 = offs[1];                                          \
    }                                                                                         \
  }
ALL_TYPES(VNNI_X_OF)

/* Expanded rows two at a time in 512-bit registers, the first in lanes 0-7 and the second in
** lanes 8-15: every lane's arithmetic is vnni's above (the same products and sums in the same
** order), in half the instructions, each of which a core with 512-bit units runs as one; up to
** two such pairs a call, so each column's codes are loaded once for four rows; a type's offset
** chains go a row a lane. A row left over goes alone through vnni's kernel. */
#define VNNI_X512_KERNEL(T, LOG2_BIAS, OFFSET)                                                \
  VNNI static inline __attribute__((always_inline)) void rows_x512_##T(                       \
      const void *const *w, const int nr, const struct tsr_q8_act *const *a, const int nc,    \
      int64_t n, float *out) {                                                                \
    const int np = nr / 2; /* row pairs: 1 or 2 */                                            \
    __m512 acc[2][TSR_Q8_COLS];                                                               \
    __m128 off[TSR_Q8_COLS]; /* each column's offset chains, a row a lane */                  \
    for (int c = 0; c < nc; c++) {                                                            \
      off[c] = _mm_setzero_ps();                                                              \
      for (int p = 0; p < np; p++) acc[p][c] = _mm512_setzero_ps();                           \
    }                                                                                         \
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3); \
    for (int64_t j = 0; j < n / TSR_Q8_ACT_BLOCK; j++) {                                      \
      __m512i u[2];                                                                           \
      __m512 sv[2];                                                                           \
      for (int p = 0; p < np; p++) {                                                          \
        const struct tsr_q8_xblock *b0 = (const struct tsr_q8_xblock *)w[2 * p] + j;          \
        const struct tsr_q8_xblock *b1 = (const struct tsr_q8_xblock *)w[2 * p + 1] + j;      \
        u[p] = _mm512_inserti64x4(                                                            \
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)b0->u)),               \
            _mm256_loadu_si256((const __m256i *)b1->u), 1);                                   \
        const __m128 s4 = _mm_castpd_ps(_mm_unpacklo_pd(_mm_load_sd((const double *)b0->s),   \
                                                        _mm_load_sd((const double *)b1->s))); \
        sv[p] = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(s4));                    \
      }                                                                                       \
      __m128 offs = _mm_setzero_ps(), offs2 = _mm_setzero_ps();                               \
      if (OFFSET) {                                                                           \
        const struct tsr_q8_xblock *const *x = (const struct tsr_q8_xblock *const *)w;        \
        offs = _mm_setr_ps(x[0][j].offs, x[1][j].offs, np > 1 ? x[2][j].offs : 0.0f,          \
                           np > 1 ? x[3][j].offs : 0.0f);                                     \
        if (OFFSET == 2)                                                                      \
          offs2 = _mm_setr_ps(x[0][j].offs2, x[1][j].offs2, np > 1 ? x[2][j].offs2 : 0.0f,    \
                              np > 1 ? x[3][j].offs2 : 0.0f);                                 \
      }                                                                                       \
      for (int c = 0; c < nc; c++) {                                                          \
        const struct tsr_q8_act *q = a[c] + j;                                                \
        const __m512i y = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)q->q));  \
        const __m512i start =                                                                 \
            LOG2_BIAS >= 0                                                                    \
                ? _mm512_slli_epi32(                                                          \
                      _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)q->nsum4)),  \
                      LOG2_BIAS)                                                              \
                : _mm512_setzero_si512();                                                     \
        const __m512 d = _mm512_set1_ps(q->d);                                                \
        const __m128 d4 = _mm512_castps512_ps128(d);                                          \
        for (int p = 0; p < np; p++)                                                          \
          acc[p][c] = _mm512_fmadd_ps(_mm512_mul_ps(sv[p], d),                                \
                                      _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, u[p], y)), \
                                      acc[p][c]);                                             \
        if (OFFSET == 1) /* lane r: OFF_STEP's */                                             \
          off[c] = _mm_fmadd_ps(_mm_mul_ps(offs, d4), _mm_set1_ps(q->sumf), off[c]);          \
        if (OFFSET == 2)                                                                      \
          off[c] = _mm_fmadd_ps(                                                              \
              _mm_mul_ps(offs2, d4), _mm_set1_ps(q->sum16[1]),                                \
              _mm_fmadd_ps(_mm_mul_ps(offs, d4), _mm_set1_ps(q->sum16[0]), off[c]));          \
      }                                                                                       \
    }                                                                                         \
    for (int c = 0; c < nc; c++) {                                                            \
      float o[4];                                                                             \
      _mm_storeu_ps(o, off[c]);                                                               \
      for (int p = 0; p < np; p++) {                                                          \
        const float s0 = tsr_hsum8(_mm512_castps512_ps256(acc[p][c]));                        \
        const float s1 =                                                                      \
            tsr_hsum8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[p][c]), 1))); \
        out[2 * p * nc + c] = OFFSET ? s0 + o[2 * p] : s0;                                    \
        out[(2 * p + 1) * nc + c] = OFFSET ? s1 + o[2 * p + 1] : s1;                          \
      }                                                                                       \
    }                                                                                         \
  }                                                                                           \
  VNNI static void x512_##T(const void *const *w, int nr, const struct tsr_q8_act *const *a,  \
                            int nc, int64_t n, float *out) {                                  \
    for (; nr > 3; nr -= 4, w += 4, out += 4 * nc) BY_COLS(rows_x512_##T, w, 4, a, nc, n, out); \
    if (nr > 1) {                                                                             \
      BY_COLS(rows_x512_##T, w, 2, a, nc, n, out);                                            \
      nr -= 2, w += 2, out += 2 * nc;                                                         \
    }                                                                                         \
    if (nr) vnni_x_##T(w, 1, a, nc, n, out);                                                  \
  }
#define VNNI_X512_OF(T, SIGNED, LOG2_BIAS, OFFSET) VNNI_X512_KERNEL(T, LOG2_BIAS, OFFSET)
ALL_TYPES(VNNI_X512_OF)

#define KERNEL_PICKER(ISA)                                                                    \
  static tsr_vec_dot_q8_fn ISA##_kernel(int dtype) {                                          \
    switch (dtype) {                                                                          \
    case TSR_Q8_0: return ISA##_q8_0;                                                         \
    case TSR_Q4_0: return ISA##_q4_0;                                                         \
    case TSR_Q4_1: return ISA##_q4_1;                                                         \
    case TSR_Q5_0: return ISA##_q5_0;                                                         \
    case TSR_Q5_1: return ISA##_q5_1;                                                         \
    case TSR_Q2_K: return ISA##_q2_K;                                                         \
    case TSR_Q3_K: return ISA##_q3_K;                                                         \
    case TSR_Q4_K: return ISA##_q4_K;                                                         \
    case TSR_Q5_K: return ISA##_q5_K;                                                         \
    case TSR_Q6_K: return ISA##_q6_K;                                                         \
    default: return NULL;                                                                     \
    }                                                                                         \
  }
KERNEL_PICKER(avx2)
KERNEL_PICKER(vnni)
KERNEL_PICKER(x512)

static tsr_vec_q8_expand_fn vnni_expander(int dtype) {
  switch (dtype) {
  case TSR_Q8_0: return expand_q8_0;
  case TSR_Q4_0: return expand_q4_0;
  case TSR_Q4_1: return expand_q4_1;
  case TSR_Q5_0: return expand_q5_0;
  case TSR_Q5_1: return expand_q5_1;
  case TSR_Q2_K: return expand_q2_K;
  case TSR_Q3_K: return expand_q3_K;
  case TSR_Q4_K: return expand_q4_K;
  case TSR_Q5_K: return expand_q5_K;
  case TSR_Q6_K: return expand_q6_K;
  default: return NULL;
  }
}

static int has_vnni(void) {
  static int cached = -1;
  if (cached < 0)
    cached = tsr_cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vnni");
  return cached;
}

static tsr_vec_dot_q8_fn isa_kernel(int dtype, enum tsr_q8_isa isa) {
  switch (isa) {
  case TSR_Q8_ISA_AVX2: return tsr_cpu_has_avx2() ? avx2_kernel(dtype) : NULL;
  case TSR_Q8_ISA_VNNI: return has_vnni() ? vnni_kernel(dtype) : NULL;
  default: return NULL;
  }
}

tsr_vec_q8_expand_fn tsr_vec_q8_expander(int dtype) {
  return has_vnni() ? vnni_expander(dtype) : NULL;
}

tsr_vec_dot_q8_fn tsr_vec_dot_q8x(int dtype) { return has_vnni() ? x512_kernel(dtype) : NULL; }
#else
static tsr_vec_dot_q8_fn isa_kernel(int dtype, enum tsr_q8_isa isa) {
  (void)dtype, (void)isa;
  return NULL;
}

tsr_vec_q8_expand_fn tsr_vec_q8_expander(int dtype) {
  (void)dtype;
  return NULL;
}

tsr_vec_dot_q8_fn tsr_vec_dot_q8x(int dtype) {
  (void)dtype;
  return NULL;
}
#endif

/* ---- dispatch --------------------------------------------------------------------------- */

void tsr_vec_quantize_q8(const float *x, int64_t n, struct tsr_q8_act *out) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (tsr_cpu_has_avx2()) {
    quantize_avx2(x, n, out);
    return;
  }
#endif
  tsr_vec_quantize_q8_ref(x, n, out);
}

#define PORTABLE(T)                                                                           \
  static void ref_##T(const void *const *w, int nr, const struct tsr_q8_act *const *a, int nc,\
                      int64_t n, float *out) {                                                \
    for (int r = 0; r < nr; r++)                                                              \
      for (int c = 0; c < nc; c++) out[r * nc + c] = tsr_vec_dot_q8_ref(TSR_##T, w[r], a[c], n); \
  }
PORTABLE(Q8_0)
PORTABLE(Q4_0)
PORTABLE(Q4_1)
PORTABLE(Q5_0)
PORTABLE(Q5_1)
PORTABLE(Q2_K)
PORTABLE(Q3_K)
PORTABLE(Q4_K)
PORTABLE(Q5_K)
PORTABLE(Q6_K)

tsr_vec_dot_q8_fn tsr_vec_dot_q8_isa(int dtype, enum tsr_q8_isa isa) {
  if (isa != TSR_Q8_ISA_REF) return isa_kernel(dtype, isa);
  switch (dtype) {
  case TSR_Q8_0: return ref_Q8_0;
  case TSR_Q4_0: return ref_Q4_0;
  case TSR_Q4_1: return ref_Q4_1;
  case TSR_Q5_0: return ref_Q5_0;
  case TSR_Q5_1: return ref_Q5_1;
  case TSR_Q2_K: return ref_Q2_K;
  case TSR_Q3_K: return ref_Q3_K;
  case TSR_Q4_K: return ref_Q4_K;
  case TSR_Q5_K: return ref_Q5_K;
  case TSR_Q6_K: return ref_Q6_K;
  default: return NULL;
  }
}

tsr_vec_dot_q8_fn tsr_vec_dot_q8(int dtype) {
  for (int isa = TSR_Q8_ISA_COUNT - 1; isa > TSR_Q8_ISA_REF; isa--) {
    const tsr_vec_dot_q8_fn k = isa_kernel(dtype, (enum tsr_q8_isa)isa);
    if (k) return k;
  }
  return tsr_vec_dot_q8_isa(dtype, TSR_Q8_ISA_REF);
}
