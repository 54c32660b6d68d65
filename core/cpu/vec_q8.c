/*
** Weight rows dotted with columns quantized to 8 bits (the cpu backend's `activations: q8`):
** a column becomes blocks of 32 int8 codes q with a scale d (x ~ d q) once per product, and
** each 32 values of a row meet a block in integers: the sum over 4 adjacent values of code
** x code is exact, then multiplied by the row's scale for those values and d into 8 f32
** lanes (lane k: values 4k..4k+3 of each block), which are summed at the end in one fixed
** tree; an offset (q4_1's and q5_1's m, the K types' mins) meets the block's code sum in one
** more f32 chain. The portable reference computes every step in that order, so the AVX2
** kernels equal it bit for bit (core/tests/test_vec_q8.c); machines without AVX2 run the
** reference.
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
  a->d = finite ? amax / 127.0f : NAN;
  a->sum = sum;
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
  float offs;
};

static void scales_all(struct sub32 *s, float v) {
  for (int k = 0; k < 8; k++) s->scale[k] = v;
}

static bool has_offset(int dtype) {
  return dtype == TSR_Q4_1 || dtype == TSR_Q5_1 || dtype == TSR_Q4_K || dtype == TSR_Q5_K;
}

/* the low nibble of qs[l] is value l, the high one value l + 16 (q4_0, q4_1, q5_0, q5_1) */
static int nibble_of(const uint8_t *qs, int l) { return l < 16 ? qs[l] & 15 : qs[l - 16] >> 4; }

static int fifth_bit(const uint8_t qh[4], int l) { return (qh[l / 8] >> (l % 8) & 1) << 4; }

static void expand(int dtype, const void *w, int64_t j, struct sub32 *s) {
  s->offs = 0.0f;
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
    off = fmaf(s.offs * a->d, (float)a->sum, off);
  }
  return has_offset(dtype) ? lanes_sum(lane) + off : lanes_sum(lane);
}


/* ---- AVX2 ------------------------------------------------------------------------------- */

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))

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
    int32_t codes[TSR_Q8_ACT_BLOCK];
    for (int i = 0; i < 4; i++)
      _mm256_storeu_si256((__m256i *)(codes + 8 * i),
                          _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id)));
    finish_block(am, finite, codes, &out[b]);
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

/* A type's kernel: each 32 values expanded once and met by every column, each column in its
** own lanes and offset chain (so one column's result is the same whatever columns are
** with it). SIGNED: the codes' sign moved onto the columns' codes; UNIFORM: one scale for
** all 8 lanes (all but q6_K). */
#define COLS_KERNEL(T, SIGNED, OFFSET, UNIFORM)                                               \
  AVX2 static inline __attribute__((always_inline)) void body_##T(                            \
      const void *w, const struct tsr_q8_act *const *a, const int nc, int64_t n, float *out) { \
    __m256 acc[TSR_Q8_COLS];                                                                  \
    float off[TSR_Q8_COLS];                                                                   \
    for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps(), off[c] = 0.0f;                 \
    const __m256i ones = _mm256_set1_epi16(1);                                                \
    for (int64_t j = 0; j < n / TSR_Q8_ACT_BLOCK; j++) {                                      \
      __m256i codes;                                                                          \
      __m256 sv;                                                                              \
      float offs;                                                                             \
      blk_##T(w, j, &codes, &sv, &offs);                                                      \
      const __m256i u = SIGNED ? _mm256_abs_epi8(codes) : codes;                              \
      for (int c = 0; c < nc; c++) {                                                          \
        const struct tsr_q8_act *q = a[c] + j;                                                \
        __m256i y = _mm256_loadu_si256((const __m256i *)q->q);                                \
        if (SIGNED) y = _mm256_sign_epi8(y, codes);                                           \
        const __m256 isum =                                                                   \
            _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u, y), ones));          \
        /* one scale for all lanes: its product with d in a scalar, the same bits */          \
        const __m256 s = UNIFORM ? _mm256_set1_ps(_mm256_cvtss_f32(sv) * q->d)                \
                                 : _mm256_mul_ps(sv, _mm256_set1_ps(q->d));                   \
        acc[c] = _mm256_fmadd_ps(s, isum, acc[c]);                                            \
        if (OFFSET) off[c] = fmaf(offs * q->d, (float)q->sum, off[c]);                        \
      }                                                                                       \
    }                                                                                         \
    for (int c = 0; c < nc; c++) out[c] = OFFSET ? tsr_hsum8(acc[c]) + off[c] : tsr_hsum8(acc[c]);    \
  }                                                                                           \
  /* one body a column count, so the columns' sums stay in registers */                      \
  AVX2 static void cols_##T(const void *w, const struct tsr_q8_act *const *a, int nc,         \
                            int64_t n, float *out) {                                          \
    switch (nc) {                                                                             \
    case 1: body_##T(w, a, 1, n, out); break;                                                 \
    case 2: body_##T(w, a, 2, n, out); break;                                                 \
    case 3: body_##T(w, a, 3, n, out); break;                                                 \
    case 4: body_##T(w, a, 4, n, out); break;                                                 \
    case 5: body_##T(w, a, 5, n, out); break;                                                 \
    case 6: body_##T(w, a, 6, n, out); break;                                                 \
    case 7: body_##T(w, a, 7, n, out); break;                                                 \
    default: body_##T(w, a, 8, n, out);                                                       \
    }                                                                                         \
  }
COLS_KERNEL(q8_0, 1, 0, 1)
COLS_KERNEL(q4_0, 1, 0, 1)
COLS_KERNEL(q5_0, 1, 0, 1)
COLS_KERNEL(q4_1, 0, 1, 1)
COLS_KERNEL(q5_1, 0, 1, 1)
COLS_KERNEL(q4_K, 0, 1, 1)
COLS_KERNEL(q5_K, 0, 1, 1)
COLS_KERNEL(q6_K, 1, 0, 0)

static tsr_vec_dot_q8_fn avx2_kernel(int dtype) {
  if (!tsr_cpu_has_avx2()) return NULL;
  switch (dtype) {
  case TSR_Q8_0: return cols_q8_0;
  case TSR_Q4_0: return cols_q4_0;
  case TSR_Q4_1: return cols_q4_1;
  case TSR_Q5_0: return cols_q5_0;
  case TSR_Q5_1: return cols_q5_1;
  case TSR_Q4_K: return cols_q4_K;
  case TSR_Q5_K: return cols_q5_K;
  case TSR_Q6_K: return cols_q6_K;
  default: return NULL;
  }
}
#else
static tsr_vec_dot_q8_fn avx2_kernel(int dtype) {
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
  static void ref_##T(const void *w, const struct tsr_q8_act *const *a, int nc, int64_t n,    \
                      float *out) {                                                           \
    for (int c = 0; c < nc; c++) out[c] = tsr_vec_dot_q8_ref(TSR_##T, w, a[c], n);            \
  }
PORTABLE(Q8_0)
PORTABLE(Q4_0)
PORTABLE(Q4_1)
PORTABLE(Q5_0)
PORTABLE(Q5_1)
PORTABLE(Q4_K)
PORTABLE(Q5_K)
PORTABLE(Q6_K)

tsr_vec_dot_q8_fn tsr_vec_dot_q8(int dtype) {
  const tsr_vec_dot_q8_fn k = avx2_kernel(dtype);
  if (k) return k;
  switch (dtype) {
  case TSR_Q8_0: return ref_Q8_0;
  case TSR_Q4_0: return ref_Q4_0;
  case TSR_Q4_1: return ref_Q4_1;
  case TSR_Q5_0: return ref_Q5_0;
  case TSR_Q5_1: return ref_Q5_1;
  case TSR_Q4_K: return ref_Q4_K;
  case TSR_Q5_K: return ref_Q5_K;
  case TSR_Q6_K: return ref_Q6_K;
  default: return NULL;
  }
}
