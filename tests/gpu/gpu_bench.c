/*
** First numbers for the cuda backend: decode-shaped products (one column; the
** 65536-row shape and every product shape of a Qwen3-8B decode step), a
** prefill-shaped product (512 columns), decode attention at a few context
** lengths and prefill attention, each one graph computed repeatedly through the
** backend. Prints one BENCH line per shape with two medians and the bandwidth or
** FLOP rate each implies: "wall", the whole compute (the input upload, output
** download and stream synchronisation of a real step included), and "node", the
** node alone (CUDA events around it, tsr_backend_time_nodes): the kernel's rate
** against the roofline. H200 ceilings for scale: ~4.3 TB/s copy, ~790 dense bf16
** TFLOP/s measured.
**   gpu_bench [--cpu] [FILTER]   only the shapes whose line holds FILTER (e.g. "q4_0",
**                                "decode"); --cpu: on the cpu backend (CI runs it so)
** Nothing is checked here: tests/gpu/gpu_op_parity checks the arithmetic.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/backend.h"
#include "graph/op_times.h"
#include "op_test_util.h"

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static const char *g_filter;
static int g_lines, g_errors; /* shapes reported; errors and impossible timings */

/* Whether the shape labelled `label` is wanted (no filter: every one). */
static bool wanted(const char *label) { return !g_filter || strstr(label, g_filter); }

struct timing {
  double wall_ms, node_ms; /* medians of the repetitions; wall_ms < 0 after an error */
};

/* Times computing g: 3 warm-ups, then iters computes with node timing on. */
static struct timing time_graph(struct tsr_backend *be, struct tsr_graph *g, int iters) {
  double wall[64], node[64];
  struct tsr_op_times acc;
  struct timing r = {-1, -1};
  int i = 0;
  for (; i < 3 + iters; i++) {
    if (i == 3 && tsr_backend_time_nodes(be, &acc) != TSR_OK) break;
    memset(&acc, 0, sizeof acc);
    const double t0 = tsr_op_times_now();
    if (tsr_backend_compute(be, g) != TSR_OK) break;
    if (i >= 3) wall[i - 3] = 1e3 * (tsr_op_times_now() - t0), node[i - 3] = 1e3 * acc.node_seconds;
  }
  (void)tsr_backend_time_nodes(be, NULL);
  if (i < 3 + iters) { /* stopped by an error */
    printf("BENCH error: %s\n", tsr_error_message());
    g_errors++;
    return r;
  }
  for (i = 0; i < iters; i++)
    if (!(node[i] > 0 && node[i] <= wall[i])) { /* the node lies inside its compute */
      printf("BENCH error: repetition %d timed its node at %.4f ms of a %.4f ms compute\n", i,
             node[i], wall[i]);
      g_errors++;
      r.wall_ms = -1;
      return r;
    }
  qsort(wall, (size_t)iters, sizeof *wall, cmp_d);
  qsort(node, (size_t)iters, sizeof *node, cmp_d);
  r.wall_ms = wall[iters / 2], r.node_ms = node[iters / 2];
  return r;
}

/* A shape's line: the label, then per median its time and the rate `amount` per ms implies. */
static void report(const char *label, struct timing t, double amount, const char *unit) {
  printf("BENCH %-44s wall %8.3f ms %8.1f %s   node %8.3f ms %8.1f %s\n", label, t.wall_ms,
         amount / t.wall_ms, unit, t.node_ms, amount / t.node_ms, unit);
  g_lines++;
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
  char label[96];
  snprintf(label, sizeof label, "mat_mul %s %lldx%lld n=%lld", tsr_dtype_name(dt), (long long)m,
           (long long)k, (long long)n);
  if (!wanted(label)) return;
  void *w = weight_bytes(dt, k, m);
  struct tsr_graph *g = tsr_graph_new(16);
  struct tsr_tensor *wt = tsr_new_external(g, dt, 2, (int64_t[]){k, m}, w);
  struct tsr_tensor *x = tsr_new_tensor_2d(g, TSR_F32, k, n);
  tsr_graph_mark_output(tsr_mat_mul(g, wt, x));
  struct tsr_test_graph tg = {.g = g};
  /* kept, as the engine keeps weights: uploaded once, not at every compute */
  if (tsr_backend_keep(be, w, tsr_tensor_nbytes(wt)) == TSR_OK && tsr_test_graph_alloc(&tg) == TSR_OK) {
    tsr_test_fill_normal(x, 1.0f);
    struct timing t = time_graph(be, g, 20);
    /* weights bytes (GB/s) for a decode product (64 columns at most), FLOPs (TFLOP/s) for a
       batched one */
    if (t.wall_ms > 0 && n <= 64)
      report(label, t, (double)tsr_dtype_row_size(dt, k) * (double)m / 1e6, "GB/s");
    else if (t.wall_ms > 0)
      report(label, t, 2.0 * k * m * n / 1e9, "TFLOP/s");
  }
  tsr_backend_forget(be, w, tsr_tensor_nbytes(wt));
  free(tg.arena);
  tsr_graph_free(g);
  free(w);
}

/* mat_mul_id: E experts of [k, m], `tokens` tokens choosing `used` experts each (ids drawn
** uniformly, so about tokens used / E columns an expert), x shared by the slots (gate/up). */
static void bench_matmul_id(struct tsr_backend *be, enum tsr_dtype dt, int64_t k, int64_t m,
                            int64_t E, int64_t used, int64_t tokens) {
  char label[96];
  snprintf(label, sizeof label, "mat_mul_id %s %lldx%lld E=%lld/%lld tokens=%lld", tsr_dtype_name(dt),
           (long long)m, (long long)k, (long long)used, (long long)E, (long long)tokens);
  if (!wanted(label)) return;
  void *w = weight_bytes(dt, k, m * E);
  struct tsr_graph *g = tsr_graph_new(16);
  struct tsr_tensor *wt = tsr_new_external(g, dt, 3, (int64_t[]){k, m, E}, w);
  struct tsr_tensor *x = tsr_new_tensor_3d(g, TSR_F32, k, 1, tokens);
  struct tsr_tensor *ids = tsr_new_tensor_2d(g, TSR_I32, used, tokens);
  tsr_graph_mark_output(tsr_mat_mul_id(g, wt, x, ids));
  struct tsr_test_graph tg = {.g = g};
  if (tsr_backend_keep(be, w, tsr_tensor_nbytes(wt)) == TSR_OK && tsr_test_graph_alloc(&tg) == TSR_OK) {
    tsr_test_fill_normal(x, 1.0f);
    int32_t *id = ids->data;
    for (int64_t i = 0; i < tokens; i++) /* distinct experts a token, as a router's top-k */
      for (int64_t u = 0; u < used; u++) id[i * used + u] = (int32_t)((i * 7 + u * (E / used)) % E);
    struct timing t = time_graph(be, g, 20);
    /* FLOPs of the pairs' products */
    if (t.wall_ms > 0) report(label, t, 2.0 * k * m * used * tokens / 1e9, "TFLOP/s");
  }
  tsr_backend_forget(be, w, tsr_tensor_nbytes(wt));
  free(tg.arena);
  tsr_graph_free(g);
  free(w);
}

/* nq queries (1: decode) against nkv keys, no mask: every key seen; K in kk, V in vk
** (the label names one type where they are the same, "K/V" where not) */
static void bench_attention(struct tsr_backend *be, enum tsr_dtype kk, enum tsr_dtype vk,
                            int64_t nq, int64_t nkv, int64_t d, int64_t hq, int64_t hkv) {
  char label[96], types[32];
  snprintf(types, sizeof types, "%s%s%s", tsr_dtype_name(kk), kk == vk ? "" : "/",
           kk == vk ? "" : tsr_dtype_name(vk));
  if (nq == 1)
    snprintf(label, sizeof label, "flash_attn decode %s kv=%lld D=%lld H=%lld/%lld", types,
             (long long)nkv, (long long)d, (long long)hq, (long long)hkv);
  else
    snprintf(label, sizeof label, "flash_attn prefill %s q=%lld kv=%lld D=%lld H=%lld/%lld",
             types, (long long)nq, (long long)nkv, (long long)d, (long long)hq, (long long)hkv);
  if (!wanted(label)) return;
  void *k = weight_bytes(kk, d, nkv * hkv), *v = weight_bytes(vk, d, nkv * hkv);
  struct tsr_graph *g = tsr_graph_new(16);
  struct tsr_tensor *kt = tsr_new_external(g, kk, 3, (int64_t[]){d, nkv, hkv}, k);
  struct tsr_tensor *vt = tsr_new_external(g, vk, 3, (int64_t[]){d, nkv, hkv}, v);
  struct tsr_tensor *q = tsr_new_tensor_3d(g, TSR_F32, d, nq, hq);
  struct tsr_attn_params ap = {.scale = 0.1f};
  tsr_graph_mark_output(tsr_flash_attn(g, q, kt, vt, NULL, NULL, NULL, &ap));
  struct tsr_test_graph tg = {.g = g};
  if (tsr_backend_keep(be, k, tsr_tensor_nbytes(kt)) == TSR_OK &&
      tsr_backend_keep(be, v, tsr_tensor_nbytes(vt)) == TSR_OK && tsr_test_graph_alloc(&tg) == TSR_OK) {
    tsr_test_fill_normal(q, 1.0f);
    struct timing t = time_graph(be, g, 20);
    /* decode: the K and V bytes read once (GB/s); prefill: two products of 2 D FLOPs per
    ** (query, head, key) (TFLOP/s) */
    if (t.wall_ms > 0 && nq == 1)
      report(label, t,
             (double)(tsr_dtype_row_size(kk, d) + tsr_dtype_row_size(vk, d)) * (double)(nkv * hkv) / 1e6,
             "GB/s");
    else if (t.wall_ms > 0)
      report(label, t, 4.0 * nq * hq * nkv * d / 1e9, "TFLOP/s");
  }
  tsr_backend_forget(be, k, tsr_tensor_nbytes(kt));
  tsr_backend_forget(be, v, tsr_tensor_nbytes(vt));
  free(tg.arena);
  tsr_graph_free(g);
  free(k);
  free(v);
}

int main(int argc, char **argv) {
  (void)tsr_tests_run_, (void)tsr_tests_failed_, (void)tsr_test_failures_; /* harness unused */
  int a = 1;
  const bool cpu = a < argc && strcmp(argv[a], "--cpu") == 0;
  a += cpu;
  if (argc - a > 1 || (a < argc && argv[a][0] == '-'))
    return fprintf(stderr, "usage: gpu_bench [--cpu] [FILTER]\n"), 2;
  g_filter = a < argc ? argv[a] : NULL;
  struct tsr_backend *be = NULL;
  if ((cpu ? tsr_backend_cpu_new(0, &be) : tsr_backend_cuda_new(&be)) != TSR_OK) {
    printf("BENCH error: %s\n", tsr_error_message());
    return 1;
  }
  const enum tsr_dtype types[] = {TSR_F16, TSR_Q8_0, TSR_Q4_0, TSR_Q4_K, TSR_Q6_K};
  /* 65536 x 4096 weights: larger than the 60 MB L2 in every type */
  for (size_t i = 0; i < sizeof types / sizeof *types; i++) bench_matmul(be, types[i], 4096, 65536, 1);
  /* a Qwen3-8B decode step's products: k/v, q/o, gate/up, down, output */
  const int64_t step[][2] = {{4096, 1024}, {4096, 4096}, {4096, 12288}, {12288, 4096}, {4096, 151936}};
  for (int t = 2; t < 4; t++) /* q4_0, q4_K */
    for (size_t i = 0; i < sizeof step / sizeof *step; i++) bench_matmul(be, types[t], step[i][0], step[i][1], 1);
  /* several streams' decode step (the q8 gemv below CU_MMQ_MIN_N columns, the integer mma
     from there: builds with other crossovers compare the two at the same width), q6_K as
     the down products of q4_K_M files */
  static const int64_t cols[] = {2, 4, 8, 16, 17, 32, 64};
  for (size_t i = 0; i < sizeof cols / sizeof *cols; i++) {
    bench_matmul(be, TSR_Q4_K, 4096, 4096, cols[i]);
    bench_matmul(be, TSR_Q4_K, 4096, 12288, cols[i]);
    bench_matmul(be, TSR_Q6_K, 12288, 4096, cols[i]);
  }
  /* Qwen3-30B-A3B's experts (128, 8 a token, 2048 -> 768): prefill and 32 streams' step */
  for (int64_t tokens = 32; tokens <= 512; tokens *= 16) {
    bench_matmul_id(be, TSR_Q4_K, 2048, 768, 128, 8, tokens);
    bench_matmul_id(be, TSR_Q6_K, 768, 2048, 128, 8, tokens);
  }
  bench_matmul(be, TSR_F16, 4096, 4096, 512);
  bench_matmul(be, TSR_Q4_0, 4096, 4096, 512);
  /* K type, V type, queries (1: decode), keys, head dim, q heads, kv heads */
  static const struct {
    enum tsr_dtype k, v;
    int64_t nq, nkv, d, hq, hkv;
  } attn[] = {
      {TSR_F16, TSR_F16, 1, 256, 128, 32, 8}, /* a decode step's span near depth 0 */
      {TSR_F16, TSR_F16, 1, 4096, 128, 32, 8},
      {TSR_F16, TSR_F16, 1, 32768, 128, 32, 8},
      {TSR_Q8_0, TSR_Q8_0, 1, 32768, 128, 32, 8},
      {TSR_F16, TSR_F16, 1, 32768, 512, 16, 2},
      {TSR_F16, TSR_F16, 2048, 8192, 128, 32, 8},
      {TSR_Q8_0, TSR_Q8_0, 2048, 8192, 128, 32, 8},
      {TSR_F16, TSR_F16, 512, 8192, 512, 16, 2},
      /* long enough that the transfers of q and the output are a few percent */
      {TSR_F16, TSR_F16, 4096, 32768, 128, 32, 8},
      {TSR_F16, TSR_F16, 2048, 32768, 256, 16, 8},
      {TSR_F16, TSR_F16, 2048, 32768, 512, 16, 2},
      /* the 1M profile's full layers: K q8_0, V q4_0 (conf/gemma4-26b-a4b-1m-dca.yaml) */
      {TSR_Q8_0, TSR_Q4_0, 1, 32768, 512, 16, 2},
      {TSR_Q8_0, TSR_Q4_0, 2048, 32768, 512, 16, 2},
      /* one full layer of its decode at 1M (the step is 5 of these and the rest) */
      {TSR_Q8_0, TSR_Q4_0, 1, 1048576, 512, 16, 2},
  };
  for (size_t i = 0; i < sizeof attn / sizeof *attn; i++)
    bench_attention(be, attn[i].k, attn[i].v, attn[i].nq, attn[i].nkv, attn[i].d, attn[i].hq,
                    attn[i].hkv);
  tsr_backend_free(be);
  if (!g_lines && !g_errors) printf("BENCH error: no shape matches '%s'\n", g_filter ? g_filter : "");
  return g_errors || !g_lines;
}
