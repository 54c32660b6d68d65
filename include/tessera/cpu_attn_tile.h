/*
** The CPU online-softmax tile that the core's flash kernel and attention plugins
** share (core/cpu/ops_attention.c, plugins/attn_dca/dca_cpu.c): per query head a
** running max m, a running sum l and a weighted sum of V rows acc over tiles of
** TSR_CPU_ATTN_TILE keys. Two implementations that hand it the same logits in the
** same tiles compute the same output bit for bit; the vector primitives are the
** host's (host->kernel->vec_*), so a plugin rounds as the core does.
**
**   tsr_cpu_attn_start(&m, &l, acc, dv);
**   per tile: logits x[t] (-INFINITY for a hidden key), then
**     tsr_cpu_attn_weights(h, x, n, &m, &l, dropped, acc, dv); // x becomes the weights
**     tsr_cpu_attn_values(h, ...);                       // acc += weight * V row
**   tsr_cpu_attn_finish(acc, l, out, dv);
**
** With V skipping on a decode step (struct tsr_cpu_attn_skip), dropped is a head's
** sum of the weights of the rows it skipped, kept on the scale of l (NULL without).
*/
#ifndef TESSERA_CPU_ATTN_TILE_H
#define TESSERA_CPU_ATTN_TILE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "tessera/plugin.h"

#define TSR_CPU_ATTN_TILE 64

static inline void tsr_cpu_attn_start(float *m, float *l, float *acc, int64_t dv) {
  *m = -INFINITY;
  *l = 0.0f;
  memset(acc, 0, (size_t)dv * sizeof(float));
}

/* The largest of x[0..n) (-inf for none; a NaN is never taken), in eight running maxima so
** the comparisons do not wait on each other (and vectorize): the max of a set does not depend
** on the order, a zero's sign aside, which no use of it sees (x - m and exp(m' - m) are the same
** for either zero). */
static inline float tsr_cpu_attn_tile_max(const float *x, int64_t n) {
  float m8[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                 -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  int64_t t = 0;
  for (; t + 8 <= n; t += 8)
    for (int k = 0; k < 8; k++) m8[k] = x[t + k] > m8[k] ? x[t + k] : m8[k];
  float tmax = -INFINITY;
  for (; t < n; t++) tmax = x[t] > tmax ? x[t] : tmax;
  for (int k = 0; k < 8; k++) tmax = m8[k] > tmax ? m8[k] : tmax;
  return tmax;
}

/* Moves the running max over the tile's n logits x, rescaling l and acc, and turns
** the logits into weights exp(x - m) (the host's vec_exp_sum_f32: its vector exp, summed
** in its fixed order). A hidden key (-inf) weighs exactly 0; while m is still -inf every
** key so far was hidden, so exp(-inf - -inf) is never taken. */
static inline void tsr_cpu_attn_weights(const struct tsr_host *h, float *x, int64_t n, float *m,
                                        float *l, float *dropped, float *acc, int64_t dv) {
  const float tmax = tsr_cpu_attn_tile_max(x, n);
  if (tmax > *m) {
    if (*m != -INFINITY) {
      const float f = expf(*m - tmax);
      *l *= f;
      if (dropped) *dropped *= f;
      h->kernel->vec_scale_f32(acc, f, dv);
    }
    *m = tmax;
  }
  *l += h->kernel->vec_exp_sum_f32(x, n, *m);
}

/* The running max and sum alone over a tile's logits x (-inf: hidden; n at most
** TSR_CPU_ATTN_TILE), as tsr_cpu_attn_weights moves them, bit for bit: a mass budget's first
** pass. */
static inline void tsr_cpu_attn_measure(const struct tsr_host *h, const float *x, int64_t n,
                                        float *m, float *l) {
  const float tmax = tsr_cpu_attn_tile_max(x, n);
  if (tmax > *m) {
    if (*m != -INFINITY) *l *= expf(*m - tmax);
    *m = tmax;
  }
  float w[TSR_CPU_ATTN_TILE];
  memcpy(w, x, (size_t)n * sizeof *w);
  *l += h->kernel->vec_exp_sum_f32(w, n, *m);
}

/* A mass budget's cut, from a row's final max m and sum l over n_visible keys: a key
** whose logit is below it weighs under budget / n_visible of the row's softmax, so
** skipping every such key drops at most `budget` of it. -inf where the row saw nothing. */
static inline float tsr_cpu_attn_budget_cut(float m, float l, float budget, int64_t n_visible) {
  if (!(l > 0.0f) || n_visible <= 0) return -INFINITY;
  return m + logf(l * budget / (float)n_visible);
}

/* A tile's logits for a mass budget's first pass: keys [j0, j0 + n) into the caller's rows
** (-inf for a hidden key); returns how many are visible (0: none, rows left as they were). */
typedef int64_t (*tsr_cpu_attn_logits_fn)(void *ctx, int64_t j0, int64_t n);

/* A mass budget's first pass over n_kv keys in tiles of TSR_CPU_ATTN_TILE: each of nh rows'
** final max m[g] and sum l[g] (head g's logits at x + g * x_stride) and its cut[g]
** (tsr_cpu_attn_budget_cut). The second pass starts m, l and its sums again. */
static inline void tsr_cpu_attn_budget_pass(const struct tsr_host *h, int64_t n_kv, int64_t nh,
                                            const float *x, size_t x_stride,
                                            tsr_cpu_attn_logits_fn logits, void *ctx,
                                            float budget, float *m, float *l, float *cut) {
  int64_t visible = 0;
  for (int64_t g = 0; g < nh; g++) m[g] = -INFINITY, l[g] = 0.0f;
  for (int64_t j0 = 0; j0 < n_kv; j0 += TSR_CPU_ATTN_TILE) {
    const int64_t n = n_kv - j0 < TSR_CPU_ATTN_TILE ? n_kv - j0 : TSR_CPU_ATTN_TILE;
    const int64_t v = logits(ctx, j0, n);
    if (!v) continue;
    visible += v;
    for (int64_t g = 0; g < nh; g++)
      tsr_cpu_attn_measure(h, x + (size_t)g * x_stride, n, &m[g], &l[g]);
  }
  for (int64_t g = 0; g < nh; g++) cut[g] = tsr_cpu_attn_budget_cut(m[g], l[g], budget, visible);
}

/* Head g's skipping bar on a tile's weights exp(x - m): threshold against the running
** max m, and with a budget's cut (tsr_cpu_attn_budget_cut; budget 0: none) exp(cut - m),
** the lower of the two where both are set. */
static inline float tsr_cpu_attn_skip_bar(float threshold, float budget, float cut, float m) {
  if (!(budget > 0.0f)) return threshold;
  const float b = cut == -INFINITY ? 0.0f : expf(cut - m);
  return threshold > 0.0f && threshold < b ? threshold : b;
}

/* How a V row is read: where it lies as f32 or f16, or decoded into f32 first. */
enum tsr_cpu_row_read { TSR_CPU_ROW_F32 = 0, TSR_CPU_ROW_F16 = 1, TSR_CPU_ROW_DECODED = 2 };

/* V row t of the tile, as `how` says (a decoded row into the caller's scratch). */
typedef const void *(*tsr_cpu_attn_row_fn)(void *ctx, int64_t t, enum tsr_cpu_row_read *how);

/* V skipping on a decode step (struct tsr_decode_params): a visible key whose
** weights are all below their head's bar (below, or below_of[g] where given: a mass
** budget's, tsr_cpu_attn_skip_bar) is not read unless keep[t] (the sink and recent
** guards; NULL: none kept); read and skipped count the visible keys, and each head g
** adds a skipped key's weight to dropped[g * dropped_stride]. */
struct tsr_cpu_attn_skip {
  float below;
  const float *below_of;
  const uint8_t *keep;
  uint64_t read, skipped;
  float *dropped;
  size_t dropped_stride;
};

/* For nh heads g: acc[g] += w[g][t] * V row t over the tile's n keys. w[g] is at
** w + g * w_stride, acc[g] at acc + g * acc_stride. A key that is hidden (bias
** -inf) or whose weights all underflowed is never read, so its row is not decoded
** and any inf it holds cannot reach acc; with skip, neither is a key all of whose
** weights are below its threshold. */
static inline void tsr_cpu_attn_values(const struct tsr_host *h, const float *w, size_t w_stride,
                                       const float *bias, int64_t nh, int64_t n, float *acc,
                                       size_t acc_stride, int64_t dv, tsr_cpu_attn_row_fn row,
                                       void *ctx, struct tsr_cpu_attn_skip *skip) {
  for (int64_t t = 0; t < n; t++) {
    if (bias[t] == -INFINITY) continue;
    bool used = false;
    for (int64_t g = 0; g < nh && !used; g++) used = w[(size_t)g * w_stride + t] != 0.0f;
    if (skip) {
      skip->read++;
      bool above = false;
      for (int64_t g = 0; g < nh && !above; g++)
        above = w[(size_t)g * w_stride + t] >= (skip->below_of ? skip->below_of[g] : skip->below);
      if (used && !above && !(skip->keep && skip->keep[t])) {
        skip->skipped++;
        for (int64_t g = 0; g < nh; g++)
          skip->dropped[(size_t)g * skip->dropped_stride] += w[(size_t)g * w_stride + t];
        continue;
      }
    }
    if (!used) continue;
    enum tsr_cpu_row_read how;
    const void *r = row(ctx, t, &how);
    for (int64_t g = 0; g < nh; g++) {
      const float p = w[(size_t)g * w_stride + t];
      if (p == 0.0f) continue;
      float *a = acc + (size_t)g * acc_stride;
      if (how == TSR_CPU_ROW_F16)
        h->kernel->vec_axpy_f16(a, p, (const uint16_t *)r, dv);
      else
        h->kernel->vec_axpy_f32(a, p, (const float *)r, dv);
    }
  }
}

/* What a decode step of nh heads skipped, into the layer's counters (atomically:
** threads share them): dropped[g] / l[g] is head g's skipped share of its softmax. */
static inline void tsr_cpu_attn_count(struct tsr_decode_counters *c,
                                      const struct tsr_cpu_attn_skip *skip, const float *l,
                                      size_t l_stride, int64_t nh) {
  uint64_t mass = 0;
  for (int64_t g = 0; g < nh; g++) {
    const float lg = l[(size_t)g * l_stride], d = skip->dropped[(size_t)g * skip->dropped_stride];
    if (lg > 0.0f) mass += (uint64_t)llround((double)d / (double)lg * TSR_DECODE_MASS_UNIT);
  }
  __atomic_fetch_add(&c->v_rows_read, skip->read, __ATOMIC_RELAXED);
  __atomic_fetch_add(&c->v_rows_skipped, skip->skipped, __ATOMIC_RELAXED);
  __atomic_fetch_add(&c->query_rows, (uint64_t)nh, __ATOMIC_RELAXED);
  __atomic_fetch_add(&c->mass_dropped_e9, mass, __ATOMIC_RELAXED);
}

/* out = acc / l; l is 0 only when no key was visible, and acc is then 0: zeros. */
static inline void tsr_cpu_attn_finish(const float *acc, float l, float *out, int64_t dv) {
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  for (int64_t d = 0; d < dv; d++) out[d] = acc[d] * inv;
}

#endif
