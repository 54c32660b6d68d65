/*
** Helpers shared by the CPU op tests: build a graph, allocate it, fill its
** inputs with random values (through any strides, so a permuted or strided
** view fills exactly the elements it shows), run it on a CPU backend with a
** chosen thread count, and read any element back as a double.
**
** Typical use:
**   struct tsr_test_graph tg;
**   tsr_test_graph_init(&tg, 64);
**   struct tsr_tensor *a = tsr_new_tensor_2d(tg.g, TSR_F32, 7, 3);
**   struct tsr_tensor *y = tsr_scale(tg.g, a, 2.0f);
**   tsr_graph_mark_output(y);
**   CHECK_OK(tsr_test_graph_alloc(&tg));   // plan + arena; inputs now writable
**   tsr_test_fill_uniform(a, -1, 1);
**   CHECK_OK(tsr_test_graph_run(&tg, 2));  // 2 threads
**   ... tsr_test_get(y, i0, i1, i2, i3) ...
**   tsr_test_graph_free(&tg);
**
** The arena is filled with 0xff bytes (NaN in f32, f16 and bf16) before the
** inputs are written, so a kernel that reads memory nobody wrote shows up as
** NaN in its output.
*/
#ifndef TSR_OP_TEST_UTIL_H
#define TSR_OP_TEST_UTIL_H

#include <string.h>

#include "graph/backend.h"
#include "graph/graph.h"
#include "harness.h"

struct tsr_test_graph {
  struct tsr_graph *g;
  void *arena;
  struct tsr_graph_plan plan;
};

static inline void tsr_test_graph_init(struct tsr_test_graph *tg, int max_tensors) {
  memset(tg, 0, sizeof *tg);
  tg->g = tsr_graph_new(max_tensors);
}

/* Plans the graph and binds a fresh arena (0xff-filled). */
static inline tsr_status tsr_test_graph_alloc(struct tsr_test_graph *tg) {
  if (!tg->g) return TSR_ERR_NOMEM;
  tsr_status st = tsr_graph_status(tg->g);
  if (st != TSR_OK) return st;
  st = tsr_graph_alloc(tg->g, &tg->plan, &tg->arena);
  if (st == TSR_OK && tg->arena) memset(tg->arena, 0xff, tg->plan.arena_bytes);
  return st;
}

/* Runs the graph on a CPU backend with n_threads threads. */
static inline tsr_status tsr_test_graph_run(struct tsr_test_graph *tg, int n_threads) {
  struct tsr_backend *be = NULL;
  tsr_status st = tsr_backend_cpu_new(n_threads, &be);
  if (st != TSR_OK) return st;
  st = tsr_backend_compute(be, tg->g);
  tsr_backend_free(be);
  return st;
}

static inline void tsr_test_graph_free(struct tsr_test_graph *tg) {
  tsr_graph_free(tg->g);
  free(tg->arena);
  memset(tg, 0, sizeof *tg);
}

/* ---- element access ------------------------------------------------------ */

/* Byte address of the element (plain types) or of the block holding i0. */
static inline char *tsr_test_addr(const struct tsr_tensor *t, int64_t i0, int64_t i1, int64_t i2,
                                  int64_t i3) {
  int64_t bs = tsr_dtype_block_size(t->dtype);
  return (char *)t->data + (i0 / bs) * (int64_t)t->nb[0] + i1 * (int64_t)t->nb[1] +
         i2 * (int64_t)t->nb[2] + i3 * (int64_t)t->nb[3];
}

/* Element (i0,i1,i2,i3) as a double: f32, f16, bf16, i32, or any block type
** with a dequantizer (its block is dequantized). */
static inline double tsr_test_get(const struct tsr_tensor *t, int64_t i0, int64_t i1, int64_t i2,
                                  int64_t i3) {
  const char *p = tsr_test_addr(t, i0, i1, i2, i3);
  switch (t->dtype) {
  case TSR_F32: { float v; memcpy(&v, p, 4); return v; }
  case TSR_F16: { uint16_t h; memcpy(&h, p, 2); return tsr_f16_to_f32(h); }
  case TSR_BF16: { uint16_t h; memcpy(&h, p, 2); return tsr_bf16_to_f32(h); }
  case TSR_I32: { int32_t v; memcpy(&v, p, 4); return v; }
  default: break;
  }
  const struct tsr_dtype_traits *tr = tsr_dtype_traits((int)t->dtype);
  if (!tr || !tr->to_f32 || tr->block_size > 256) return NAN;
  float blk[256];
  tr->to_f32(p, blk, tr->block_size);
  return blk[i0 % tr->block_size];
}

/* Sets one element of a plain tensor (f32, f16, bf16, i32). */
static inline void tsr_test_set(struct tsr_tensor *t, int64_t i0, int64_t i1, int64_t i2,
                                int64_t i3, double v) {
  char *p = tsr_test_addr(t, i0, i1, i2, i3);
  switch (t->dtype) {
  case TSR_F32: { float f = (float)v; memcpy(p, &f, 4); break; }
  case TSR_F16: { uint16_t h = tsr_f32_to_f16((float)v); memcpy(p, &h, 2); break; }
  case TSR_BF16: { uint16_t h = tsr_f32_to_bf16((float)v); memcpy(p, &h, 2); break; }
  case TSR_I32: { int32_t x = (int32_t)v; memcpy(p, &x, 4); break; }
  default: fprintf(stderr, "tsr_test_set: unsupported dtype %s\n", tsr_dtype_name(t->dtype));
  }
}

/* Writes one row (ne0 values) of any tensor: plain types element by element,
** block types through the reference quantizer. */
static inline void tsr_test_set_row(struct tsr_tensor *t, int64_t i1, int64_t i2, int64_t i3,
                                    const float *vals) {
  const struct tsr_dtype_traits *tr = tsr_dtype_traits((int)t->dtype);
  if (tr && tr->block_size > 1) {
    if (tr->from_f32) tr->from_f32(vals, tsr_test_addr(t, 0, i1, i2, i3), t->ne[0]);
    else fprintf(stderr, "tsr_test_set_row: no quantizer for %s\n", tr->name);
    return;
  }
  for (int64_t i0 = 0; i0 < t->ne[0]; i0++) tsr_test_set(t, i0, i1, i2, i3, vals[i0]);
}

/* Fills every element from vals, given in row-major order (i0 fastest). */
static inline void tsr_test_fill_from(struct tsr_tensor *t, const float *vals) {
  for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
    for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
      for (int64_t i1 = 0; i1 < t->ne[1]; i1++, vals += t->ne[0])
        tsr_test_set_row(t, i1, i2, i3, vals);
}

/* Reads every element into out (row-major, i0 fastest). */
static inline void tsr_test_read(const struct tsr_tensor *t, double *out) {
  for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
    for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
      for (int64_t i1 = 0; i1 < t->ne[1]; i1++)
        for (int64_t i0 = 0; i0 < t->ne[0]; i0++) *out++ = tsr_test_get(t, i0, i1, i2, i3);
}

/* A malloc'd array of every element as a double (row-major); free() it. */
static inline double *tsr_test_read_alloc(const struct tsr_tensor *t) {
  double *out = malloc((size_t)tsr_tensor_nelements(t) * sizeof *out);
  if (out) tsr_test_read(t, out);
  return out;
}

/* ---- random fills (deterministic: the harness RNG) ---------------------- */

/* Uniform in [lo, hi); i32 tensors get integers in [lo, hi). */
static inline void tsr_test_fill_uniform(struct tsr_tensor *t, float lo, float hi) {
  int64_t n = tsr_tensor_nelements(t);
  float *v = malloc((size_t)n * sizeof *v);
  if (!v) return;
  for (int64_t i = 0; i < n; i++) {
    v[i] = tsr_test_uniform(lo, hi);
    if (t->dtype == TSR_I32) v[i] = floorf(v[i]);
  }
  tsr_test_fill_from(t, v);
  free(v);
}

/* Normal with mean 0 and standard deviation sigma. */
static inline void tsr_test_fill_normal(struct tsr_tensor *t, float sigma) {
  int64_t n = tsr_tensor_nelements(t);
  float *v = malloc((size_t)n * sizeof *v);
  if (!v) return;
  for (int64_t i = 0; i < n; i++) v[i] = sigma * tsr_test_normal();
  tsr_test_fill_from(t, v);
  free(v);
}

/* Largest |a[i] - b[i]| over n values (NaN anywhere gives INFINITY). */
static inline double tsr_test_max_abs_diff(const double *a, const double *b, int64_t n) {
  double m = 0.0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs(a[i] - b[i]);
    if (d != d) return INFINITY;
    if (d > m) m = d;
  }
  return m;
}

#endif
