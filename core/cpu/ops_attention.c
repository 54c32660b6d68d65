/*
** Built-in attention `flash` on the CPU: one streaming-softmax pass over the
** keys per (query, head), never materializing the logit matrix.
**
** Keys go in tiles: the logits of a tile are computed first, then the
** running max moves once per tile, so the accumulator is rescaled at most
** once per tile rather than once per key. The q heads that share a KV head
** (GQA) go through a tile together, so each K and V row is read once for
** all of them.
**
** A key is hidden when the mask holds -inf for it, or when positions are
** given and kv_pos < 0 (an empty cache cell), or (causal) kv_pos > q_pos, or
** (window w > 0) q_pos - kv_pos >= w. Hidden keys contribute nothing; a row
** with no visible key is all zeros. The running max starts at -inf and only
** moves to a finite value when a visible key arrives, so exp(-inf - -inf)
** never happens.
*/
#include <math.h>
#include <string.h>

#include "../dtype.h"
#include "cpu_ops.h"
#include "vec.h"

#define FA_TILE 64

/* Read-only description of one node, shared by every unit it computes. */
struct fa_node {
  const struct tsr_tensor *q, *k, *v, *mask, *q_pos, *kv_pos;
  float scale, softcap;
  bool causal;
  int32_t window;
  int64_t D, Dv, Nq, Nkv, Hq, Hkv, group;
  bool kv_f16;
  bool k_dense, v_dense; /* dim 0 is packed: rows can be read in place */
  size_t qpos_stride, kvpos_stride; /* 0: positions need the general lookup */
};

/* Per-thread scratch, carved from c->work. A unit is one query against one
** KV head for a run of the q heads that share it (GQA), so each K and V row
** is loaded once per run rather than once per q head. */
struct fa_scratch {
  float *q;    /* [group][Dp] the run's query rows, f32 and packed */
  float *acc;  /* [group][Dvp] running sums of p * V rows */
  float *s;    /* [group][FA_TILE] logits of the tile, then their weights */
  float *bias; /* [FA_TILE] mask value per key; -inf for a hidden key */
  float *m, *l; /* [group] running max and running sum */
  float *k;    /* [D] a K row gathered from a dim-0-strided view */
  float *v;    /* [Dv] likewise for V */
  size_t Dp, Dvp;
};

static size_t pad16(int64_t n) { return ((size_t)n + 15) & ~(size_t)15; }

size_t tsr_cpu_flash_attn_work(const struct tsr_tensor *dst) {
  const int64_t D = dst->src[0]->ne[0], Dv = dst->ne[0];
  const int64_t group = dst->src[0]->ne[2] / dst->src[1]->ne[2];
  const size_t per_head = pad16(D) + pad16(Dv) + FA_TILE;
  return ((size_t)group * per_head + FA_TILE + 2 * pad16(group) + pad16(D) + pad16(Dv)) *
         sizeof(float);
}

static struct fa_scratch scratch_carve(const struct tsr_cpu_compute *c, const struct fa_node *a) {
  float *w = c->work;
  struct fa_scratch s;
  s.Dp = pad16(a->D), s.Dvp = pad16(a->Dv);
  s.q = w, w += (size_t)a->group * s.Dp;
  s.acc = w, w += (size_t)a->group * s.Dvp;
  s.s = w, w += (size_t)a->group * FA_TILE;
  s.bias = w, w += FA_TILE;
  s.m = w, w += pad16(a->group);
  s.l = w, w += pad16(a->group);
  s.k = w, w += s.Dp;
  s.v = w;
  return s;
}

/* A position tensor holds N i32 values in any shape; the usual case is one
** run with a single stride, found once per node. */
static size_t pos_stride(const struct tsr_tensor *t) {
  if (!t) return 0;
  int runs = 0;
  size_t stride = t->nb[0];
  for (int d = 0; d < TSR_MAX_DIMS; d++)
    if (t->ne[d] > 1) runs++, stride = t->nb[d];
  return runs <= 1 ? stride : 0;
}

static int32_t pos_at(const struct tsr_tensor *t, size_t stride, int64_t i) {
  if (stride) return *(const int32_t *)((const char *)t->data + (size_t)i * stride);
  size_t off = 0;
  for (int d = 0; d < TSR_MAX_DIMS; d++) {
    off += (size_t)(i % t->ne[d]) * t->nb[d];
    i /= t->ne[d];
  }
  return *(const int32_t *)((const char *)t->data + off);
}

static float load_f(const void *p, bool f16) {
  return f16 ? tsr_f16_to_f32(*(const uint16_t *)p) : *(const float *)p;
}

static void gather_row(const char *row, size_t nb0, bool f16, float *out, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = load_f(row + (size_t)i * nb0, f16);
}

static bool key_hidden(const struct fa_node *a, int32_t qp, int64_t j) {
  int32_t kp = pos_at(a->kv_pos, a->kvpos_stride, j);
  if (kp < 0) return true;
  if (a->causal && kp > qp) return true;
  return a->window > 0 && (int64_t)qp - kp >= a->window;
}

/* What the mask and positions say about keys [j0, j0+n) for query iq; the
** same for every head. Returns how many keys are visible. */
static int64_t tile_bias(const struct fa_node *a, float *bias, int64_t iq, int32_t qp,
                         int64_t j0, int64_t n) {
  const char *mrow = a->mask ? (const char *)a->mask->data + (size_t)iq * a->mask->nb[1] : NULL;
  const bool mask_f16 = a->mask && a->mask->dtype == TSR_F16;
  int64_t visible = 0;
  for (int64_t t = 0; t < n; t++) {
    const int64_t j = j0 + t;
    float b = mrow ? load_f(mrow + (size_t)j * a->mask->nb[0], mask_f16) : 0.0f;
    if (a->kv_pos && key_hidden(a, qp, j)) b = -INFINITY;
    bias[t] = b;
    visible += b != -INFINITY;
  }
  return visible;
}

/* Logits of the tile's keys for nh heads into s->s (-inf for hidden keys). */
static void tile_logits(const struct fa_node *a, const struct fa_scratch *s, int64_t hk,
                        int64_t nh, int64_t j0, int64_t n) {
  const char *kbase = (const char *)a->k->data + (size_t)hk * a->k->nb[2];
  for (int64_t t = 0; t < n; t++) {
    if (s->bias[t] == -INFINITY) {
      for (int64_t g = 0; g < nh; g++) s->s[g * FA_TILE + t] = -INFINITY;
      continue;
    }
    const char *krow = kbase + (size_t)(j0 + t) * a->k->nb[1];
    if (!a->k_dense) gather_row(krow, a->k->nb[0], a->kv_f16, s->k, a->D);
    for (int64_t g = 0; g < nh; g++) {
      const float *q = s->q + (size_t)g * s->Dp;
      float x = !a->k_dense ? tsr_vec_dot_f32(s->k, q, a->D)
                : a->kv_f16 ? tsr_vec_dot_f16_f32((const uint16_t *)krow, q, a->D)
                            : tsr_vec_dot_f32((const float *)krow, q, a->D);
      x *= a->scale;
      if (a->softcap > 0.0f) x = a->softcap * tanhf(x / a->softcap);
      s->s[g * FA_TILE + t] = x + s->bias[t];
    }
  }
}

/* Moves head g's running max to cover the tile, rescaling what it has
** summed so far, and turns the tile's logits into weights exp(x - m). */
static void tile_weights(const struct fa_node *a, const struct fa_scratch *s, int64_t g,
                         int64_t n) {
  float *x = s->s + g * FA_TILE, *acc = s->acc + (size_t)g * s->Dvp;
  float tmax = -INFINITY;
  for (int64_t t = 0; t < n; t++) tmax = x[t] > tmax ? x[t] : tmax;
  if (tmax > s->m[g]) {
    if (s->m[g] != -INFINITY) {
      const float f = expf(s->m[g] - tmax);
      s->l[g] *= f;
      tsr_vec_scale_f32(acc, f, a->Dv);
    }
    s->m[g] = tmax;
  }
  /* hidden keys weigh exactly 0; while m is still -inf every key is hidden,
  ** so exp(-inf - -inf) is never taken */
  const float m = s->m[g];
  float sum = 0.0f;
  for (int64_t t = 0; t < n; t++) {
    x[t] = x[t] == -INFINITY ? 0.0f : expf(x[t] - m);
    sum += x[t];
  }
  s->l[g] += sum;
}

static void tile_values(const struct fa_node *a, const struct fa_scratch *s, int64_t hk,
                        int64_t nh, int64_t j0, int64_t n) {
  const char *vbase = (const char *)a->v->data + (size_t)hk * a->v->nb[2];
  for (int64_t t = 0; t < n; t++) {
    if (s->bias[t] == -INFINITY) continue;
    const char *vrow = vbase + (size_t)(j0 + t) * a->v->nb[1];
    if (!a->v_dense) gather_row(vrow, a->v->nb[0], a->kv_f16, s->v, a->Dv);
    for (int64_t g = 0; g < nh; g++) {
      const float p = s->s[g * FA_TILE + t];
      float *acc = s->acc + (size_t)g * s->Dvp;
      if (p == 0.0f) continue; /* underflowed: skip the row (and any inf it holds) */
      if (!a->v_dense)
        tsr_vec_axpy_f32(acc, p, s->v, a->Dv);
      else if (a->kv_f16)
        tsr_vec_axpy_f16(acc, p, (const uint16_t *)vrow, a->Dv);
      else
        tsr_vec_axpy_f32(acc, p, (const float *)vrow, a->Dv);
    }
  }
}

/* Query iq against KV head hk for q heads h0 .. h0+nh-1. */
static void attend_unit(const struct fa_node *a, const struct fa_scratch *s,
                        struct tsr_tensor *dst, int64_t iq, int64_t hk, int64_t h0, int64_t nh) {
  for (int64_t g = 0; g < nh; g++) {
    const char *qrow =
        (const char *)a->q->data + (size_t)iq * a->q->nb[1] + (size_t)(h0 + g) * a->q->nb[2];
    gather_row(qrow, a->q->nb[0], false, s->q + (size_t)g * s->Dp, a->D);
    memset(s->acc + (size_t)g * s->Dvp, 0, (size_t)a->Dv * sizeof(float));
    s->m[g] = -INFINITY;
    s->l[g] = 0.0f;
  }
  const int32_t qp = a->q_pos ? pos_at(a->q_pos, a->qpos_stride, iq) : 0;
  for (int64_t j0 = 0; j0 < a->Nkv; j0 += FA_TILE) {
    const int64_t n = a->Nkv - j0 < FA_TILE ? a->Nkv - j0 : FA_TILE;
    if (!tile_bias(a, s->bias, iq, qp, j0, n)) continue; /* m, l and acc stay put */
    tile_logits(a, s, hk, nh, j0, n);
    for (int64_t g = 0; g < nh; g++) tile_weights(a, s, g, n);
    tile_values(a, s, hk, nh, j0, n);
  }
  for (int64_t g = 0; g < nh; g++) {
    float *out = (float *)((char *)dst->data + (size_t)(h0 + g) * dst->nb[1] +
                           (size_t)iq * dst->nb[2]);
    const float *acc = s->acc + (size_t)g * s->Dvp;
    /* l is 0 only when no key was visible; acc is then 0 too: a zero row */
    const float inv = s->l[g] > 0.0f ? 1.0f / s->l[g] : 0.0f;
    for (int64_t d = 0; d < a->Dv; d++) out[d] = acc[d] * inv;
  }
}

TSR_CPU_KERNEL(flash_attn) {
  struct fa_node a = {
      .q = dst->src[0],
      .k = dst->src[1],
      .v = dst->src[2],
      .mask = dst->src[3],
      .q_pos = dst->src[4],
      .kv_pos = dst->src[5],
      .scale = tsr_param_f32(dst, 0),
      .softcap = tsr_param_f32(dst, 1),
      .causal = dst->op_params[2] != 0,
      .window = dst->op_params[3],
  };
  a.D = a.q->ne[0];
  a.Dv = a.v->ne[0];
  a.Nq = a.q->ne[1];
  a.Hq = a.q->ne[2];
  a.Nkv = a.k->ne[1];
  a.Hkv = a.k->ne[2];
  a.group = a.Hq / a.Hkv;
  a.kv_f16 = a.k->dtype == TSR_F16;
  const size_t es = a.kv_f16 ? sizeof(uint16_t) : sizeof(float);
  a.k_dense = a.k->nb[0] == es;
  a.v_dense = a.v->nb[0] == es;
  a.qpos_stride = pos_stride(a.q_pos);
  a.kvpos_stride = pos_stride(a.kv_pos);
  const struct fa_scratch s = scratch_carve(c, &a);

  /* Split each group into runs only as far as it takes to give every thread
  ** a unit (decode with few KV heads); each head's arithmetic is the same
  ** whatever the split, so results do not depend on the thread count. */
  int64_t runs = 1;
  while (runs < a.group && a.Nq * a.Hkv * runs < c->nth) runs++;
  const int64_t run_len = (a.group + runs - 1) / runs;
  runs = (a.group + run_len - 1) / run_len;
  /* Interleave units across threads: with causal prefill later queries see
  ** more keys, so contiguous chunks would leave the first thread idle. */
  const int64_t n_units = a.Nq * a.Hkv * runs;
  for (int64_t u = c->ith; u < n_units; u += c->nth) {
    const int64_t iq = u / (a.Hkv * runs), hk = u / runs % a.Hkv, r = u % runs;
    const int64_t h0 = hk * a.group + r * run_len;
    const int64_t nh = a.group - r * run_len < run_len ? a.group - r * run_len : run_len;
    attend_unit(&a, &s, dst, iq, hk, h0, nh);
  }
}
