#include "vec.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "graph/dtype.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TSR_HAVE_AVX2_PATH 1

__attribute__((target("avx2,fma"))) static float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}

/* The last values of a dot (past whole vectors), one at a time: one function, so every
** f32 dot below rounds its tail alike. */
__attribute__((target("avx2,fma"))) static inline float dot_tail(float s, const float *x,
                                                                const float *y, int64_t i,
                                                                int64_t n) {
  for (; i < n; i++) s += x[i] * y[i];
  return s;
}

/* Sixteen values a step in two accumulators (the first and second eight), eight more in
** the first, then their sum and the tail: the order tsr_vec_dot2x2_f32 keeps per output. */
__attribute__((target("avx2,fma"))) static float dot_f32_avx2(const float *x, const float *y,
                                                               int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), a1);
  }
  for (; i + 8 <= n; i += 8)
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
  return dot_tail(hsum256(_mm256_add_ps(a0, a1)), x, y, i, n);
}

/* Rows w0, w1 against columns x0, x1: each value loaded once for two products. */
__attribute__((target("avx2,fma"))) static void dot2x2_f32_avx2(const float *w0, const float *w1,
                                                                const float *x0, const float *x1,
                                                                int64_t n, float out[4]) {
  __m256 a[4], b[4];
  for (int j = 0; j < 4; j++) a[j] = b[j] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 r0 = _mm256_loadu_ps(w0 + i), r1 = _mm256_loadu_ps(w1 + i);
    __m256 c0 = _mm256_loadu_ps(x0 + i), c1 = _mm256_loadu_ps(x1 + i);
    a[0] = _mm256_fmadd_ps(r0, c0, a[0]), a[1] = _mm256_fmadd_ps(r1, c0, a[1]);
    a[2] = _mm256_fmadd_ps(r0, c1, a[2]), a[3] = _mm256_fmadd_ps(r1, c1, a[3]);
    r0 = _mm256_loadu_ps(w0 + i + 8), r1 = _mm256_loadu_ps(w1 + i + 8);
    c0 = _mm256_loadu_ps(x0 + i + 8), c1 = _mm256_loadu_ps(x1 + i + 8);
    b[0] = _mm256_fmadd_ps(r0, c0, b[0]), b[1] = _mm256_fmadd_ps(r1, c0, b[1]);
    b[2] = _mm256_fmadd_ps(r0, c1, b[2]), b[3] = _mm256_fmadd_ps(r1, c1, b[3]);
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 r0 = _mm256_loadu_ps(w0 + i), r1 = _mm256_loadu_ps(w1 + i);
    const __m256 c0 = _mm256_loadu_ps(x0 + i), c1 = _mm256_loadu_ps(x1 + i);
    a[0] = _mm256_fmadd_ps(r0, c0, a[0]), a[1] = _mm256_fmadd_ps(r1, c0, a[1]);
    a[2] = _mm256_fmadd_ps(r0, c1, a[2]), a[3] = _mm256_fmadd_ps(r1, c1, a[3]);
  }
  const float *rows[4] = {w0, w1, w0, w1}, *cols[4] = {x0, x0, x1, x1};
  for (int j = 0; j < 4; j++)
    out[j] = dot_tail(hsum256(_mm256_add_ps(a[j], b[j])), rows[j], cols[j], i, n);
}

/* Thirty-two values a step in four accumulators (an attention row of 128 is four steps, not
** one chain of sixteen dependent multiply-adds), eight more in the first, then (a0 + a1) +
** (a2 + a3) and the tail; LOAD8(i) and LOAD1(i) read x as f32. One body for f16 rows and for
** rows already converted, so the two give the same bits. */
#define DOT4ACC(LOAD8, LOAD1)                                                                 \
  __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),             \
                 _mm256_setzero_ps()};                                                        \
  int64_t i = 0;                                                                              \
  for (; i + 32 <= n; i += 32)                                                                \
    for (int k = 0; k < 4; k++)                                                               \
      a[k] = _mm256_fmadd_ps(LOAD8(i + 8 * k), _mm256_loadu_ps(y + i + 8 * k), a[k]);        \
  for (; i + 8 <= n; i += 8) a[0] = _mm256_fmadd_ps(LOAD8(i), _mm256_loadu_ps(y + i), a[0]);  \
  float s = hsum256(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));     \
  for (; i < n; i++) s += LOAD1(i) * y[i];                                                    \
  return s;
#define F16_LOAD8(j) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + (j))))
#define F16_LOAD1(j) tsr_f16_to_f32(x[j])
#define F32_LOAD8(j) _mm256_loadu_ps(x + (j))
#define F32_LOAD1(j) x[j]
__attribute__((target("avx2,fma,f16c"))) static float dot_f16_f32_avx2(const uint16_t *x,
                                                                       const float *y,
                                                                       int64_t n) {
  DOT4ACC(F16_LOAD8, F16_LOAD1)
}
__attribute__((target("avx2,fma,f16c"))) static float dot_f32_as_f16_avx2(const float *x,
                                                                          const float *y,
                                                                          int64_t n) {
  DOT4ACC(F32_LOAD8, F32_LOAD1)
}
/* Row y against rows x[0..NX) (n a multiple of 32): DOT4ACC's arithmetic for each, y loaded once
** for all of them */
__attribute__((target("avx2,fma"), always_inline)) static inline void
dots_as_f16_avx2(const float *const *x, const int NX, const float *y, int64_t n, float *out) {
  __m256 a[3][4];
  for (int t = 0; t < NX; t++)
    for (int k = 0; k < 4; k++) a[t][k] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 32)
    for (int k = 0; k < 4; k++) {
      const __m256 yv = _mm256_loadu_ps(y + i + 8 * k);
      for (int t = 0; t < NX; t++)
        a[t][k] = _mm256_fmadd_ps(_mm256_loadu_ps(x[t] + i + 8 * k), yv, a[t][k]);
    }
  for (int t = 0; t < NX; t++)
    out[t] = hsum256(
        _mm256_add_ps(_mm256_add_ps(a[t][0], a[t][1]), _mm256_add_ps(a[t][2], a[t][3])));
}
__attribute__((target("avx2,fma"))) static void dots3_as_f16_avx2(const float *const *x, int nx,
                                                                 const float *y, int64_t n,
                                                                 float *out) {
  switch (nx) {
  case 1: dots_as_f16_avx2(x, 1, y, n, out); break;
  case 2: dots_as_f16_avx2(x, 2, y, n, out); break;
  default: dots_as_f16_avx2(x, 3, y, n, out);
  }
}

/* y += a[t] x_t over t in order, skipping a[t] == 0 (n a multiple of 8): axpy_f32_avx2's
** multiply-add for each element, with 64 (then 8) values of y held in registers over every t */
__attribute__((target("avx2,fma"))) static void axpy_run_f32_avx2(float *y, const float *a,
                                                                 const float *x, size_t x_stride,
                                                                 int64_t nt, int64_t n) {
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m256 acc[8];
    for (int v = 0; v < 8; v++) acc[v] = _mm256_loadu_ps(y + i + 8 * v);
    for (int64_t t = 0; t < nt; t++) {
      if (a[t] == 0.0f) continue;
      const __m256 av = _mm256_set1_ps(a[t]);
      const float *xt = x + (size_t)t * x_stride + i;
      for (int v = 0; v < 8; v++) acc[v] = _mm256_fmadd_ps(av, _mm256_loadu_ps(xt + 8 * v), acc[v]);
    }
    for (int v = 0; v < 8; v++) _mm256_storeu_ps(y + i + 8 * v, acc[v]);
  }
  for (; i < n; i += 8) {
    __m256 acc = _mm256_loadu_ps(y + i);
    for (int64_t t = 0; t < nt; t++)
      if (a[t] != 0.0f)
        acc = _mm256_fmadd_ps(_mm256_set1_ps(a[t]), _mm256_loadu_ps(x + (size_t)t * x_stride + i),
                              acc);
    _mm256_storeu_ps(y + i, acc);
  }
}

__attribute__((target("avx2,fma"))) static void axpy_f32_avx2(float *y, float a, const float *x,
                                                               int64_t n) {
  __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; i++) y[i] += a * x[i];
}

__attribute__((target("avx2,fma,f16c"))) static void axpy_f16_avx2(float *y, float a,
                                                                    const uint16_t *x, int64_t n) {
  __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 xf = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i)));
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, xf, _mm256_loadu_ps(y + i)));
  }
  for (; i < n; i++) y[i] += a * tsr_f16_to_f32(x[i]);
}

/* 512-bit twins of the dots and the V run above: two of their 256-bit accumulators side by
** side in one register (lanes 0-7 the first, 8-15 the second), every lane's arithmetic theirs
** in the same order, so the bits are the same with half the instructions */
#define AVX512 __attribute__((target("avx2,fma,f16c,avx512f")))
static int has_avx512f(void) {
  static int cached = -1;
  if (cached < 0) cached = __builtin_cpu_supports("avx512f");
  return cached;
}
AVX512 static inline __m256 lo256(__m512 v) { return _mm512_castps512_ps256(v); }
AVX512 static inline __m256 hi256(__m512 v) {
  return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}
/* dots_as_f16_avx2's sums: a[t][0] holds its accumulators 0 and 1, a[t][1] 2 and 3 */
AVX512 __attribute__((always_inline)) static inline void
dots_as_f16_avx512(const float *const *x, const int NX, const float *y, int64_t n, float *out) {
  __m512 a[3][2];
  for (int t = 0; t < NX; t++) a[t][0] = a[t][1] = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 32)
    for (int k = 0; k < 2; k++) {
      const __m512 yv = _mm512_loadu_ps(y + i + 16 * k);
      for (int t = 0; t < NX; t++)
        a[t][k] = _mm512_fmadd_ps(_mm512_loadu_ps(x[t] + i + 16 * k), yv, a[t][k]);
    }
  for (int t = 0; t < NX; t++)
    out[t] = hsum256(_mm256_add_ps(_mm256_add_ps(lo256(a[t][0]), hi256(a[t][0])),
                                   _mm256_add_ps(lo256(a[t][1]), hi256(a[t][1]))));
}
AVX512 static void dots3_as_f16_avx512(const float *const *x, int nx, const float *y, int64_t n,
                                       float *out) {
  switch (nx) {
  case 1: dots_as_f16_avx512(x, 1, y, n, out); break;
  case 2: dots_as_f16_avx512(x, 2, y, n, out); break;
  default: dots_as_f16_avx512(x, 3, y, n, out);
  }
}
/* axpy_run_f32_avx2's multiply-adds, 128 values of y in registers (then 64, then its 8) */
AVX512 static void axpy_run_f32_avx512(float *y, const float *a, const float *x, size_t x_stride,
                                       int64_t nt, int64_t n) {
  int64_t i = 0;
  for (; i + 128 <= n; i += 128) {
    __m512 acc[8];
    for (int v = 0; v < 8; v++) acc[v] = _mm512_loadu_ps(y + i + 16 * v);
    for (int64_t t = 0; t < nt; t++) {
      if (a[t] == 0.0f) continue;
      const __m512 av = _mm512_set1_ps(a[t]);
      const float *xt = x + (size_t)t * x_stride + i;
      for (int v = 0; v < 8; v++)
        acc[v] = _mm512_fmadd_ps(av, _mm512_loadu_ps(xt + 16 * v), acc[v]);
    }
    for (int v = 0; v < 8; v++) _mm512_storeu_ps(y + i + 16 * v, acc[v]);
  }
  if (i < n) axpy_run_f32_avx2(y + i, a, x + i, x_stride, nt, n - i);
}

int tsr_cpu_has_avx2(void) {
  static int cached = -1;
  if (cached < 0)
    cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
  return cached;
}

/* e^x in 8 lanes: x = k ln2 + r (ln2 in two parts), e^r by Cephes' degree-7 polynomial
** (about 1 ulp), times 2^k; 0 below -87.33 and +inf above 88.72, as expf rounds there
** (a subnormal expf is 0 here). Every step an explicit multiply-add or a single operation,
** so the bits do not depend on how the compiler contracts. */
__attribute__((target("avx2,fma"))) static __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654f), hi = _mm256_set1_ps(88.72283f);
  const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.0f));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
  /* NaN in, NaN out */
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* x[t] = exp8(x[t] - m), 0 where x[t] is -inf, eight at a time (the last ones padded with
** -inf) */
__attribute__((target("avx2,fma"))) static void exp_avx2(float *x, int64_t n, float m) {
  const __m256 mv = _mm256_set1_ps(m), ninf = _mm256_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 8) {
    float pad[8];
    const bool whole = i + 8 <= n;
    if (!whole)
      for (int k = 0; k < 8; k++) pad[k] = i + k < n ? x[i + k] : -INFINITY;
    const __m256 v = _mm256_loadu_ps(whole ? x + i : pad);
    const __m256 e = _mm256_blendv_ps(exp8(_mm256_sub_ps(v, mv)), _mm256_setzero_ps(),
                                      _mm256_cmp_ps(v, ninf, _CMP_EQ_OQ));
    _mm256_storeu_ps(whole ? x + i : pad, e);
    if (!whole)
      for (int k = 0; i + k < n; k++) x[i + k] = pad[k];
  }
}

/* x sigmoid(x), and x sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)) (GELU's tanh form) */
__attribute__((target("avx2,fma"))) static __m256 silu8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
  return _mm256_mul_ps(x, _mm256_div_ps(one, _mm256_add_ps(one, e)));
}

__attribute__((target("avx2,fma"))) static __m256 gelu8(__m256 x) {
  const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
  const __m256 u = _mm256_mul_ps(_mm256_fmadd_ps(x3, _mm256_set1_ps(0.044715f), x),
                                 _mm256_set1_ps(2.0f * 0.7978845608028654f));
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), u));
  return _mm256_mul_ps(x, _mm256_div_ps(one, _mm256_add_ps(one, e)));
}

/* f over y in place, 8 at a time; the last values through the same lanes (so each value's
** result does not depend on where it falls in the row) */
#define MAP8(NAME, F)                                                                         \
  __attribute__((target("avx2,fma"))) static void NAME(float *y, int64_t n) {                 \
    int64_t i = 0;                                                                            \
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, F(_mm256_loadu_ps(y + i)));           \
    if (i < n) {                                                                              \
      float t[8] = {0};                                                                       \
      memcpy(t, y + i, (size_t)(n - i) * sizeof(float));                                      \
      _mm256_storeu_ps(t, F(_mm256_loadu_ps(t)));                                             \
      memcpy(y + i, t, (size_t)(n - i) * sizeof(float));                                      \
    }                                                                                         \
  }
MAP8(silu_avx2, silu8)
MAP8(gelu_avx2, gelu8)
#else
#define TSR_HAVE_AVX2_PATH 0
int tsr_cpu_has_avx2(void) { return 0; }
#endif

/* The f32 dot in index order: the scalar path of the f32 dots. */
static float dot_f32_ref(const float *x, const float *y, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; i++) s += x[i] * y[i];
  return s;
}

float tsr_vec_dot_f32(const float *x, const float *y, int64_t n) {
#if TSR_HAVE_AVX2_PATH
  if (tsr_cpu_has_avx2()) return dot_f32_avx2(x, y, n);
#endif
  return dot_f32_ref(x, y, n);
}

void tsr_vec_dot2x2_f32(const float *w0, const float *w1, const float *x0, const float *x1,
                        int64_t n, float out[4]) {
#if TSR_HAVE_AVX2_PATH
  if (tsr_cpu_has_avx2()) {
    dot2x2_f32_avx2(w0, w1, x0, x1, n, out);
    return;
  }
#endif
  out[0] = tsr_vec_dot_f32(w0, x0, n), out[1] = tsr_vec_dot_f32(w1, x0, n);
  out[2] = tsr_vec_dot_f32(w0, x1, n), out[3] = tsr_vec_dot_f32(w1, x1, n);
}

#if TSR_HAVE_AVX2_PATH
/* R rows against C columns: one accumulator an output, eight values a step, then the tail;
** R, C constants where it is called, so the accumulators stay in registers */
__attribute__((target("avx2,fma"), always_inline)) static inline void
dot_block_avx2(const float *const *w, int R, const float *const *x, int C, int64_t n,
               float *out) {
  __m256 acc[4][3];
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 xv[3];
    for (int c = 0; c < C; c++) xv[c] = _mm256_loadu_ps(x[c] + i);
    for (int r = 0; r < R; r++) {
      const __m256 wv = _mm256_loadu_ps(w[r] + i);
      for (int c = 0; c < C; c++) acc[r][c] = _mm256_fmadd_ps(wv, xv[c], acc[r][c]);
    }
  }
  for (int c = 0; c < C; c++)
    for (int r = 0; r < R; r++) out[c * R + r] = dot_tail(hsum256(acc[r][c]), w[r], x[c], i, n);
}

#define DOT_BLOCK(R, C)                                                                          \
  __attribute__((target("avx2,fma"))) static void dot_block_##R##x##C(                          \
      const float *const *w, const float *const *x, int64_t n, float *out) {                    \
    dot_block_avx2(w, R, x, C, n, out);                                                          \
  }
DOT_BLOCK(1, 1) DOT_BLOCK(2, 1) DOT_BLOCK(3, 1) DOT_BLOCK(4, 1)
DOT_BLOCK(1, 2) DOT_BLOCK(2, 2) DOT_BLOCK(3, 2) DOT_BLOCK(4, 2)
DOT_BLOCK(1, 3) DOT_BLOCK(2, 3) DOT_BLOCK(3, 3) DOT_BLOCK(4, 3)
typedef void (*dot_block_fn)(const float *const *, const float *const *, int64_t, float *);
static const dot_block_fn g_dot_blocks[3][4] = {
    {dot_block_1x1, dot_block_2x1, dot_block_3x1, dot_block_4x1},
    {dot_block_1x2, dot_block_2x2, dot_block_3x2, dot_block_4x2},
    {dot_block_1x3, dot_block_2x3, dot_block_3x3, dot_block_4x3}};
#endif

void tsr_vec_dot_block_f32(const float *const *w, int n_rows, const float *const *x, int n_cols,
                           int64_t n, float *out) {
#if TSR_HAVE_AVX2_PATH
  if (tsr_cpu_has_avx2()) {
    g_dot_blocks[n_cols - 1][n_rows - 1](w, x, n, out);
    return;
  }
#endif
  for (int c = 0; c < n_cols; c++)
    for (int r = 0; r < n_rows; r++) out[c * n_rows + r] = tsr_vec_dot_f32(w[r], x[c], n);
}

float tsr_vec_dot_f16_f32(const uint16_t *x, const float *y, int64_t n) {
#if TSR_HAVE_AVX2_PATH
  if (tsr_cpu_has_avx2()) return dot_f16_f32_avx2(x, y, n);
#endif
  float s = 0.0f;
  for (int64_t i = 0; i < n; i++) s += tsr_f16_to_f32(x[i]) * y[i];
  return s;
}

float tsr_vec_dot_f32_as_f16(const float *x, const float *y, int64_t n) {
#if TSR_HAVE_AVX2_PATH
  if (tsr_cpu_has_avx2()) return dot_f32_as_f16_avx2(x, y, n);
#endif
  return dot_f32_ref(x, y, n); /* the f16 dot's scalar order too: x holds f16 values */
}

void tsr_vec_dots_f32_as_f16(const float *const *x, int nx, const float *y, int64_t n,
                             float *out) {
#if TSR_HAVE_AVX2_PATH
  if (tsr_cpu_has_avx2() && n % 32 == 0) {
    (has_avx512f() ? dots3_as_f16_avx512 : dots3_as_f16_avx2)(x, nx, y, n, out);
    return;
  }
#endif
  for (int t = 0; t < nx; t++) out[t] = tsr_vec_dot_f32_as_f16(x[t], y, n);
}

void tsr_vec_axpy_run_f32(float *y, const float *a, const float *x, size_t x_stride, int64_t nt,
                          int64_t n) {
#if TSR_HAVE_AVX2_PATH
  if (tsr_cpu_has_avx2() && n % 8 == 0) {
    (has_avx512f() ? axpy_run_f32_avx512 : axpy_run_f32_avx2)(y, a, x, x_stride, nt, n);
    return;
  }
#endif
  for (int64_t t = 0; t < nt; t++)
    if (a[t] != 0.0f) tsr_vec_axpy_f32(y, a[t], x + (size_t)t * x_stride, n);
}

void tsr_vec_axpy_f32(float *y, float a, const float *x, int64_t n) {
#if TSR_HAVE_AVX2_PATH
  if (tsr_cpu_has_avx2()) { axpy_f32_avx2(y, a, x, n); return; }
#endif
  for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

void tsr_vec_axpy_f16(float *y, float a, const uint16_t *x, int64_t n) {
#if TSR_HAVE_AVX2_PATH
  if (tsr_cpu_has_avx2()) { axpy_f16_avx2(y, a, x, n); return; }
#endif
  for (int64_t i = 0; i < n; i++) y[i] += a * tsr_f16_to_f32(x[i]);
}

void tsr_vec_scale_f32(float *y, float a, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] *= a;
}

/* exp8's steps on one value (fmaf is exact, so the bits are exp8's) */
static float exp1(float x) {
  const float lo = -87.33654f, hi = 88.72283f;
  const float xc = fminf(fmaxf(x, lo), 88.0f);
  const float k = nearbyintf(xc * 1.44269504088896341f);
  float r = fmaf(-k, 0.693359375f, xc);
  r = fmaf(-k, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fmaf(p, r, 1.3981999507e-3f);
  p = fmaf(p, r, 8.3334519073e-3f);
  p = fmaf(p, r, 4.1665795894e-2f);
  p = fmaf(p, r, 1.6666665459e-1f);
  p = fmaf(p, r, 5.0000001201e-1f);
  p = fmaf(p, r * r, r + 1.0f);
  const uint32_t bits = (uint32_t)((int32_t)lrintf(k) + 127) << 23;
  float two_k;
  memcpy(&two_k, &bits, sizeof two_k);
  float y = p * two_k;
  if (x < lo) y = 0.0f;
  if (x > hi) y = INFINITY;
  return isnan(x) ? x : y;
}

/* The nonzero values of x summed in 8 lanes by their rank (the k-th in lane k % 8), then the
** lanes in a fixed tree: where zeros fall (hidden keys) does not move a value's lane. */
static float rank_lanes_sum(const float *x, int64_t n) {
  float lane[8] = {0};
  int64_t k = 0;
  for (int64_t t = 0; t < n; t++)
    if (x[t] != 0.0f) lane[k++ % 8] += x[t];
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

float tsr_vec_exp_sum_f32(float *x, int64_t n, float m) {
#if TSR_HAVE_AVX2_PATH
  if (tsr_cpu_has_avx2()) {
    exp_avx2(x, n, m);
    return rank_lanes_sum(x, n);
  }
#endif
  return tsr_vec_exp_sum_f32_ref(x, n, m);
}

float tsr_vec_exp_sum_f32_ref(float *x, int64_t n, float m) {
  for (int64_t t = 0; t < n; t++) x[t] = x[t] == -INFINITY ? 0.0f : exp1(x[t] - m);
  return rank_lanes_sum(x, n);
}

bool tsr_vec_silu_f32(float *y, int64_t n) {
#if TSR_HAVE_AVX2_PATH
  if (tsr_cpu_has_avx2()) { silu_avx2(y, n); return true; }
#endif
  (void)y, (void)n;
  return false;
}

bool tsr_vec_gelu_f32(float *y, int64_t n) {
#if TSR_HAVE_AVX2_PATH
  if (tsr_cpu_has_avx2()) { gelu_avx2(y, n); return true; }
#endif
  (void)y, (void)n;
  return false;
}
