/* A KV codec's reference functions and hooks driven the way the engine drives them,
** shared by the codec plugins' tests. Include after tests/harness.h. */
#ifndef TSR_CODEC_TEST_UTIL_H
#define TSR_CODEC_TEST_UTIL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "abi/plugin_host.h"
#include "graph/backend.h"
#include "graph/graph.h"

/* Node o of graph g (NULL: the graph's error) marked as the output, planned into *arena
** (the caller frees it) and computed on backend b */
static inline tsr_status tsr_test_compute_node(struct tsr_backend *b, struct tsr_graph *g,
                                               struct tsr_tensor *o, void **arena) {
  *arena = NULL;
  if (!o) return tsr_graph_status(g);
  struct tsr_graph_plan plan;
  tsr_graph_mark_output(o);
  tsr_status st = tsr_graph_alloc(g, &plan, arena);
  return st == TSR_OK ? tsr_backend_compute(b, g) : st;
}

/* x [in_dim, rows] through the codec's prepare_rows (forward, to its storage dim) or
** finish_out (inverse, to out_dim) on the cpu backend cpu: the result, malloc'd */
static inline float *tsr_test_codec_hook(struct tsr_backend *cpu, const struct tsr_kv_codec_v1 *c,
                                         const float *x, int64_t in_dim, int64_t rows,
                                         bool inverse, int64_t out_dim) {
  struct tsr_graph *g = tsr_graph_new(16);
  struct tsr_tensor *in = tsr_new_external(g, TSR_F32, 2, (int64_t[]){in_dim, rows}, (void *)x);
  const struct tsr_kv_codec_site site = {.struct_size = sizeof site, .layer = 0, .is_k = true,
                                         .head_dim = (int32_t)out_dim};
  struct tsr_tensor *out =
      inverse ? c->finish_out(c->ctx, tsr_plugin_host_services(), g, &site, in)
              : c->prepare_rows(c->ctx, tsr_plugin_host_services(), g, &site, in);
  float *r = NULL;
  if (out) {
    const int64_t n = out->ne[0] * out->ne[1];
    void *arena;
    const tsr_status st = tsr_test_compute_node(cpu, g, out, &arena);
    CHECK_OK(st);
    CHECK(out->ne[0] == (inverse ? out_dim : c->storage_dim(c->ctx, (int32_t)in_dim)));
    if (st == TSR_OK && (r = malloc(sizeof(float) * (size_t)n)))
      memcpy(r, out->data, sizeof(float) * (size_t)n);
    free(arena);
  } else {
    CHECK_MSG(0, "hook failed: %s", tsr_error_message());
  }
  tsr_graph_free(g);
  return r;
}

/* rows [n values, whole blocks] -> the codec's blocks -> f32, malloc'd */
static inline float *tsr_test_codec_round_trip(const struct tsr_kv_codec_v1 *c, const float *y,
                                               int64_t n) {
  void *blocks = calloc((size_t)(n / c->block_size), c->block_bytes);
  float *r = malloc(sizeof(float) * (size_t)n);
  c->encode_rows(c->ctx, y, blocks, n);
  c->decode_f32(c->ctx, blocks, r, n);
  free(blocks);
  return r;
}

/* flash over K [D, nkv, hkv] / V [Dv, nkv, hkv] stored in codecs kt / vt, nq (at most 4)
** queries at positions nkv.., causal, on backend b: out [Dv, hq, nq]; K and V each lifted to
** f16 first where lift_k / lift_v (what flash's negotiation plans for a codec no read kernel
** takes beside the other side) */
static inline bool tsr_test_codec_flash_lifted(struct tsr_backend *b,
                                               const struct tsr_kv_codec_v1 *kt,
                                               const struct tsr_kv_codec_v1 *vt,
                                               const void *kbytes, const void *vbytes,
                                               const float *q, const int32_t *kvpos, int D,
                                               int Dv, int nkv, int hkv, int hq, int nq,
                                               bool lift_k, bool lift_v, float *out) {
  struct tsr_graph *g = tsr_graph_new(16);
  struct tsr_tensor *qt = tsr_new_external(g, TSR_F32, 3, (int64_t[]){D, nq, hq}, (void *)q);
  struct tsr_tensor *k = tsr_new_external(g, (enum tsr_dtype)kt->dtype, 3,
                                          (int64_t[]){D, nkv, hkv}, (void *)kbytes);
  struct tsr_tensor *v = tsr_new_external(g, (enum tsr_dtype)vt->dtype, 3,
                                          (int64_t[]){Dv, nkv, hkv}, (void *)vbytes);
  if (lift_k) k = tsr_cast(g, k, TSR_F16);
  if (lift_v) v = tsr_cast(g, v, TSR_F16);
  int32_t qpos[4];
  for (int i = 0; i < nq; i++) qpos[i] = nkv + i;
  struct tsr_tensor *qp = tsr_new_external(g, TSR_I32, 1, (int64_t[]){nq}, qpos);
  struct tsr_tensor *kp = tsr_new_external(g, TSR_I32, 1, (int64_t[]){nkv}, (void *)kvpos);
  const struct tsr_attn_params p = {.scale = 1.0f / sqrtf((float)D), .causal = true};
  struct tsr_tensor *o = tsr_flash_attn(g, qt, k, v, NULL, qp, kp, &p);
  void *arena;
  const tsr_status st = tsr_test_compute_node(b, g, o, &arena);
  if (st == TSR_OK) memcpy(out, o->data, sizeof(float) * (size_t)Dv * hq * nq);
  CHECK_MSG(st == TSR_OK, "flash on %s: %s", tsr_backend_name(b), tsr_error_message());
  free(arena);
  tsr_graph_free(g);
  return st == TSR_OK;
}

static inline bool tsr_test_codec_flash(struct tsr_backend *b, const struct tsr_kv_codec_v1 *kt,
                                        const struct tsr_kv_codec_v1 *vt, const void *kbytes,
                                        const void *vbytes, const float *q, const int32_t *kvpos,
                                        int D, int Dv, int nkv, int hkv, int hq, int nq,
                                        float *out) {
  return tsr_test_codec_flash_lifted(b, kt, vt, kbytes, vbytes, q, kvpos, D, Dv, nkv, hkv, hq,
                                     nq, false, false, out);
}

/* |a - b| / |b| over n values (|a - b| where b is all zeros) */
static inline double tsr_test_rel_err(const float *a, const float *b, size_t n) {
  double e = 0, r = 0;
  for (size_t i = 0; i < n; i++)
    e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), r += (double)b[i] * b[i];
  return r > 0 ? sqrt(e / r) : sqrt(e);
}

#endif
