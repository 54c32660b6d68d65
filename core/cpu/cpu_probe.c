/*
** The cpu backend's ceilings for `tessera bench`, from the hardware rather than from its own
** kernels: memory bandwidth as a streaming read of 256 MiB (every pool thread reading its
** own share, the bytes summed so the loads stay), and the multiply-add peak of the pool's
** threads at the clock they run, in the arithmetic the products use: with `activations: q8`
** the 8-bit integer dot of the q8 kernels (vec_q8.c: 12 independent chains of vpdpbusd on
** AVX-512 VNNI, of maddubs, madd and add on AVX2), else f32 (12 independent chains of 8-wide
** FMAs a thread, enough to cover the FMA latency on every AVX2 core; 8 scalar chains on
** machines without AVX2). Each is the median of 5 runs after a warm-up.
*/
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "cpu_ops.h"
#include "graph/backend.h"
#include "graph/op_times.h"
#include "threadpool.h"
#include "vec.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2,fma")))
#endif

enum { READ_BYTES = 256 << 20, FMA_STEPS = 1 << 23, FMA_CHAINS = 12 };

struct probe_run {
  const float *buf;
  int64_t n;       /* floats in buf */
  float sink[256]; /* a value per thread, so no work is dead */
};

#if defined(__x86_64__) && defined(__GNUC__)
AVX2 static float read_avx2(const float *p, int64_t n) {
  __m256 a = _mm256_setzero_ps(), b = a, c = a, d = a;
  for (int64_t i = 0; i + 32 <= n; i += 32) {
    a = _mm256_add_ps(a, _mm256_load_ps(p + i));
    b = _mm256_add_ps(b, _mm256_load_ps(p + i + 8));
    c = _mm256_add_ps(c, _mm256_load_ps(p + i + 16));
    d = _mm256_add_ps(d, _mm256_load_ps(p + i + 24));
  }
  float out[8];
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
  return out[0] + out[7];
}

/* The q8 kernels' integer dot, 32 multiply-adds an instruction sequence a chain step */
#define VNNI_T __attribute__((target("avx2,avx512f,avx512vl,avx512bw,avx512vnni")))
VNNI_T static float dot8_vnni(void) {
  __m256i acc[FMA_CHAINS];
  const __m256i u = _mm256_set1_epi8(3), y = _mm256_set1_epi8(-2);
  for (int i = 0; i < FMA_CHAINS; i++) acc[i] = _mm256_set1_epi32(i);
  for (int s = 0; s < FMA_STEPS; s++)
    for (int i = 0; i < FMA_CHAINS; i++) acc[i] = _mm256_dpbusd_epi32(acc[i], u, y);
  __m256i t = acc[0];
  for (int i = 1; i < FMA_CHAINS; i++) t = _mm256_add_epi32(t, acc[i]);
  return (float)_mm256_extract_epi32(t, 0);
}

AVX2 static float dot8_avx2(void) {
  __m256i acc[FMA_CHAINS];
  const __m256i u = _mm256_set1_epi8(3), y = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
  for (int i = 0; i < FMA_CHAINS; i++) acc[i] = _mm256_set1_epi32(i);
  for (int s = 0; s < FMA_STEPS; s++)
    for (int i = 0; i < FMA_CHAINS; i++)
      acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), ones));
  __m256i t = acc[0];
  for (int i = 1; i < FMA_CHAINS; i++) t = _mm256_add_epi32(t, acc[i]);
  return (float)_mm256_extract_epi32(t, 0);
}

AVX2 static float fma_avx2(void) {
  __m256 acc[FMA_CHAINS];
  const __m256 m = _mm256_set1_ps(0.999999f), add = _mm256_set1_ps(1e-7f);
  for (int i = 0; i < FMA_CHAINS; i++) acc[i] = _mm256_set1_ps((float)i);
  for (int s = 0; s < FMA_STEPS; s++)
    for (int i = 0; i < FMA_CHAINS; i++) acc[i] = _mm256_fmadd_ps(acc[i], m, add);
  __m256 t = acc[0];
  for (int i = 1; i < FMA_CHAINS; i++) t = _mm256_add_ps(t, acc[i]);
  float out[8];
  _mm256_storeu_ps(out, t);
  return out[0];
}
#endif

static void read_share(void *arg, int ith, int nth) {
  struct probe_run *r = arg;
  const int64_t per = (r->n / nth) & ~(int64_t)31, lo = per * ith;
#if defined(__x86_64__) && defined(__GNUC__)
  if (tsr_cpu_has_avx2()) {
    r->sink[ith & 255] = read_avx2(r->buf + lo, per);
    return;
  }
#endif
  float s[8] = {0};
  for (int64_t i = 0; i < per; i++) s[i & 7] += r->buf[lo + i];
  r->sink[ith & 255] = s[0] + s[7];
}

static void fma_peak(void *arg, int ith, int nth) {
  struct probe_run *r = arg;
  (void)nth;
#if defined(__x86_64__) && defined(__GNUC__)
  if (tsr_cpu_has_avx2()) {
    r->sink[ith & 255] = fma_avx2();
    return;
  }
#endif
  float acc[8];
  for (int i = 0; i < 8; i++) acc[i] = (float)i;
  for (int s = 0; s < FMA_STEPS; s++)
    for (int i = 0; i < 8; i++) acc[i] = acc[i] * 0.999999f + 1e-7f;
  r->sink[ith & 255] = acc[0] + acc[7];
}

/* the q8 products' integer dot on this machine: 2 (VNNI), 1 (AVX2), 0 (none) */
static int int8_dot_kind(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (tsr_vec_dot_q8_isa(TSR_Q8_0, TSR_Q8_ISA_VNNI)) return 2;
  if (tsr_vec_dot_q8_isa(TSR_Q8_0, TSR_Q8_ISA_AVX2)) return 1;
#endif
  return 0;
}

static void int8_peak(void *arg, int ith, int nth) {
  struct probe_run *r = arg;
  (void)nth;
#if defined(__x86_64__) && defined(__GNUC__)
  r->sink[ith & 255] = int8_dot_kind() == 2 ? dot8_vnni() : dot8_avx2();
#else
  (void)r, (void)ith;
#endif
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* median seconds of 5 runs of fn on every pool thread, after one */
static double median_run(struct tsr_threadpool *pool, tsr_thread_fn fn, struct probe_run *r) {
  double t[5];
  for (int i = -1; i < 5; i++) {
    const double t0 = tsr_op_times_now();
    tsr_threadpool_run(pool, fn, r);
    if (i >= 0) t[i] = tsr_op_times_now() - t0;
  }
  qsort(t, 5, sizeof *t, cmp_double);
  return t[2];
}

tsr_status tsr_cpu_probe(struct tsr_threadpool *pool, bool q8, struct tsr_backend_ceilings *out) {
  const int nth = tsr_threadpool_size(pool);
  struct probe_run r = {.n = READ_BYTES / (int64_t)sizeof(float)};
  void *buf = NULL;
  if (posix_memalign(&buf, 64, READ_BYTES))
    return tsr_error_set(TSR_ERR_NOMEM, "cpu backend: the bandwidth probe's %d MiB",
                         READ_BYTES >> 20);
  memset(buf, 0, READ_BYTES); /* every page present before the clock starts */
  r.buf = buf;
  const double read_s = median_run(pool, read_share, &r);
  const int64_t read = (r.n / nth & ~(int64_t)31) * nth * (int64_t)sizeof(float);
  free(buf);
  const double fma_s = median_run(pool, fma_peak, &r);
  const bool avx2 = tsr_cpu_has_avx2();
  const double flops = (double)nth * FMA_STEPS * (avx2 ? FMA_CHAINS * 8 : 8) * 2.0;
  out->copy_bytes_per_s = (double)read / read_s;
  out->gemm_flops = flops / fma_s;
  snprintf(out->copy_how, sizeof out->copy_how, "a streaming read of %d MiB by %d threads",
           READ_BYTES >> 20, nth);
  snprintf(out->gemm_how, sizeof out->gemm_how,
           "f32 multiply-add peak of %d threads: %s, %.1f GFLOP/s a thread", nth,
           avx2 ? "12 independent 8-wide FMA chains (AVX2)" : "8 independent scalar chains",
           out->gemm_flops / nth / 1e9);
  const int kind = int8_dot_kind();
  if (q8 && kind) { /* the products run as 8-bit integer dots: their peak is the ceiling */
    const double int8_s = median_run(pool, int8_peak, &r);
    out->gemm_flops = (double)nth * FMA_STEPS * FMA_CHAINS * 32 * 2.0 / int8_s;
    snprintf(out->gemm_how, sizeof out->gemm_how,
             "8-bit integer multiply-add peak of %d threads (activations q8): 12 independent "
             "chains of %s, %.1f GOP/s a thread", nth,
             kind == 2 ? "vpdpbusd (AVX-512 VNNI)" : "maddubs, madd and add (AVX2)",
             out->gemm_flops / nth / 1e9);
  }
  return TSR_OK;
}
