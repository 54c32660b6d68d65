/*
** First numbers for the cuda backend: decode-shaped products (one column),
** a prefill-shaped product (512 columns), decode attention at a few
** context lengths and prefill attention (2048 or 512 queries over 8192 keys), each one graph computed repeatedly through the backend
** (so every time includes the input upload, output download and stream
** synchronisation of a real step). Prints one BENCH line per shape with the
** median time and the bandwidth or FLOP rate it implies; H200 ceilings for
** scale: ~4.3 TB/s copy, ~790 dense bf16 TFLOP/s measured.
** Nothing is checked here: tests/gpu/gpu_op_parity checks the arithmetic.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "op_test_util.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Median ms of computing g; -1 on an error (printed). */
static double time_graph(struct tsr_backend *be, struct tsr_graph *g, int iters) {
  double t[64];
  for (int i = 0; i < 3 + iters; i++) {
    double t0 = now_ms();
    if (tsr_backend_compute(be, g) != TSR_OK) {
      printf("BENCH error: %s\n", tsr_error_message());
      return -1;
    }
    if (i >= 3) t[i - 3] = now_ms() - t0;
  }
  qsort(t, (size_t)iters, sizeof *t, cmp_d);
  return t[iters / 2];
}

/* Random bytes in dt's layout: timing does not depend on the values, and
** quantizing hundreds of MB with the reference quantizers would take minutes. */
static void *weight_bytes(enum tsr_dtype dt, int64_t k, int64_t m) {
  size_t n = tsr_dtype_row_size(dt, k) * (size_t)m;
  uint32_t *w = malloc((n + 3) & ~(size_t)3);
  uint32_t x = 12345;
  for (size_t i = 0; i < (n + 3) / 4; i++) {
    x = x * 1664525u + 1013904223u;
    w[i] = (x >> 8) & 0x3bff3bffu; /* keeps f16 / bf16 halves finite */
  }
  return w;
}

static void bench_matmul(struct tsr_backend *be, enum tsr_dtype dt, int64_t k, int64_t m, int64_t n) {
  void *w = weight_bytes(dt, k, m);
  struct tsr_graph *g = tsr_graph_new(16);
  struct tsr_tensor *wt = tsr_new_external(g, dt, 2, (int64_t[]){k, m}, w);
  struct tsr_tensor *x = tsr_new_tensor_2d(g, TSR_F32, k, n);
  tsr_graph_mark_output(tsr_mat_mul(g, wt, x));
  struct tsr_test_graph tg = {.g = g};
  /* kept, as the engine keeps weights: uploaded once, not at every compute */
  if (tsr_backend_keep(be, w, tsr_tensor_nbytes(wt)) == TSR_OK && tsr_test_graph_alloc(&tg) == TSR_OK) {
    tsr_test_fill_normal(x, 1.0f);
    double ms = time_graph(be, g, 20);
    double bytes = (double)tsr_dtype_row_size(dt, k) * (double)m;
    if (ms > 0)
      printf("BENCH mat_mul %-5s %5lldx%-5lld n=%-4lld %8.3f ms  %7.1f GB/s weights  %7.2f TFLOP/s\n",
             tsr_dtype_name(dt), (long long)m, (long long)k, (long long)n, ms, bytes / ms / 1e6,
             2.0 * k * m * n / ms / 1e9);
  }
  tsr_backend_forget(be, w, tsr_tensor_nbytes(wt));
  free(tg.arena);
  tsr_graph_free(g);
  free(w);
}

/* nq queries (1: decode) against nkv keys, no mask: every key seen */
static void bench_attention(struct tsr_backend *be, enum tsr_dtype kv, int64_t nq, int64_t nkv,
                            int64_t d, int64_t hq, int64_t hkv) {
  void *k = weight_bytes(kv, d, nkv * hkv), *v = weight_bytes(kv, d, nkv * hkv);
  struct tsr_graph *g = tsr_graph_new(16);
  struct tsr_tensor *kt = tsr_new_external(g, kv, 3, (int64_t[]){d, nkv, hkv}, k);
  struct tsr_tensor *vt = tsr_new_external(g, kv, 3, (int64_t[]){d, nkv, hkv}, v);
  struct tsr_tensor *q = tsr_new_tensor_3d(g, TSR_F32, d, nq, hq);
  struct tsr_attn_params ap = {.scale = 0.1f};
  tsr_graph_mark_output(tsr_flash_attn(g, q, kt, vt, NULL, NULL, NULL, &ap));
  struct tsr_test_graph tg = {.g = g};
  if (tsr_backend_keep(be, k, tsr_tensor_nbytes(kt)) == TSR_OK &&
      tsr_backend_keep(be, v, tsr_tensor_nbytes(vt)) == TSR_OK && tsr_test_graph_alloc(&tg) == TSR_OK) {
    tsr_test_fill_normal(q, 1.0f);
    double ms = time_graph(be, g, 20);
    double bytes = 2.0 * (double)tsr_dtype_row_size(kv, d) * (double)(nkv * hkv);
    if (ms > 0 && nq == 1)
      printf("BENCH flash_attn decode %-5s kv=%-7lld D=%lld H=%lld/%lld %8.3f ms  %7.1f GB/s K+V\n",
             tsr_dtype_name(kv), (long long)nkv, (long long)d, (long long)hq, (long long)hkv, ms,
             bytes / ms / 1e6);
    else if (ms > 0) /* two products of 2 D FLOPs per (query, head, key) */
      printf("BENCH flash_attn prefill %-5s q=%lld kv=%-6lld D=%lld H=%lld/%lld %8.3f ms  %7.2f "
             "TFLOP/s\n", tsr_dtype_name(kv), (long long)nq, (long long)nkv, (long long)d,
             (long long)hq, (long long)hkv, ms, 4.0 * nq * hq * nkv * d / ms / 1e9);
  }
  tsr_backend_forget(be, k, tsr_tensor_nbytes(kt));
  tsr_backend_forget(be, v, tsr_tensor_nbytes(vt));
  free(tg.arena);
  tsr_graph_free(g);
  free(k);
  free(v);
}

int main(void) {
  (void)tsr_tests_run_, (void)tsr_tests_failed_, (void)tsr_test_failures_; /* harness unused */
  struct tsr_backend *be = NULL;
  if (tsr_backend_cuda_new(&be) != TSR_OK) {
    printf("BENCH error: %s\n", tsr_error_message());
    return 1;
  }
  const enum tsr_dtype types[] = {TSR_F16, TSR_Q8_0, TSR_Q4_0, TSR_Q4_K, TSR_Q6_K};
  /* 65536 x 4096 weights: larger than the 60 MB L2 in every type */
  for (size_t i = 0; i < sizeof types / sizeof *types; i++) bench_matmul(be, types[i], 4096, 65536, 1);
  bench_matmul(be, TSR_F16, 4096, 4096, 512);
  bench_matmul(be, TSR_Q4_0, 4096, 4096, 512);
  bench_attention(be, TSR_F16, 1, 4096, 128, 32, 8);
  bench_attention(be, TSR_F16, 1, 32768, 128, 32, 8);
  bench_attention(be, TSR_Q8_0, 1, 32768, 128, 32, 8);
  bench_attention(be, TSR_F16, 1, 32768, 512, 16, 2);
  bench_attention(be, TSR_F16, 2048, 8192, 128, 32, 8);
  bench_attention(be, TSR_Q8_0, 2048, 8192, 128, 32, 8);
  bench_attention(be, TSR_F16, 512, 8192, 512, 16, 2);
  /* long enough that the transfers of q and the output are a few percent */
  bench_attention(be, TSR_F16, 4096, 32768, 128, 32, 8);
  bench_attention(be, TSR_F16, 2048, 32768, 256, 16, 8);
  bench_attention(be, TSR_F16, 2048, 32768, 512, 16, 2);
  tsr_backend_free(be);
  return 0;
}
