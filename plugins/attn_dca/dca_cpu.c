/*
** attn_dca's CPU kernels.
**
** dca_attention_cpu is one streaming-softmax pass over the keys per (query,
** KV head, run of the q heads sharing it), built like the core's flash kernel
** (core/cpu/ops_attention.c) so that, with every key in the intra band, it
** does the same arithmetic in the same order with the same vector primitives
** (host->kernel->vec_*): DCA over a context of at most one chunk is bit-identical to
** flash. What it adds: each visible key picks the query rotation of its band
** from its absolute position (analytic bounds, no mask tensor), and the
** logits of queries past `temp_from` positions get the YaRN temperature.
** All three bands feed one running max and sum, which is the log-sum-exp
** merge of three separate attentions done in one pass; a band without keys
** adds nothing, a row without keys is zeros.
**
** K and V are read where they lie (f32, f16) or decoded a row at a time
** through their codec (bf16, block types, plugin codecs), only for visible
** keys: a step never converts the cache.
**
** dca_positions_cpu turns i32 positions into the rotation positions of
** queries (three per token), keys (p mod C) or a shift (per-key delta).
*/
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dca.h"
#include "tessera/cpu_attn_tile.h"

#define DCA_TILE TSR_CPU_ATTN_TILE /* flash's tile: the same tiles give the same rounding */

float dca_logit_gain(int32_t p, int32_t from) {
  if (from <= 0 || (int64_t)p + 1 <= from) return 1.0f;
  const double f = 0.1 * log(((double)p + 1.0) / (double)from) + 1.0;
  return (float)(f * f);
}

static int32_t mod_c(int64_t p, int32_t c) {
  int64_t r = p % c;
  return (int32_t)(r < 0 ? r + c : r);
}

/* ---- positions --------------------------------------------------------------- */

void dca_positions_cpu(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                       const struct tsr_tensor_info *src, int n_src, const int32_t *params) {
  (void)ctx, (void)nth, (void)n_src;
  if (ith != 0) return; /* a few thousand integers */
  const int32_t mode = params[0], c = params[1], cs = params[2], delta = params[3];
  const struct tsr_tensor_info *pos = &src[0];
  const int64_t n = pos->ne[0];
  int32_t *out = dst->data;
  for (int64_t i = 0; i < n; i++) {
    const int32_t p = *(const int32_t *)((const char *)pos->data + (size_t)i * pos->nb[0]);
    const int32_t r = mod_c(p, c);
    if (mode == DCA_POS_KEY) {
      out[i] = r;
    } else if (mode == DCA_POS_SHIFT) {
      out[i] = mod_c((int64_t)p + delta, c) - r;
    } else {
      const int64_t succ = (int64_t)r + c, inter = 2 * (int64_t)c - 1;
      out[i] = r;
      out[n + i] = (int32_t)(succ < cs ? succ : cs);
      out[2 * n + i] = (int32_t)(inter < cs ? inter : cs);
    }
  }
}

/* ---- attention --------------------------------------------------------------- */

enum row_read { READ_F32, READ_F16, READ_CODEC, READ_GATHER };

struct rows {
  enum row_read read;
  int32_t dtype;
  size_t nb0;
  const struct tsr_kv_codec_v1 *codec;
};

struct node {
  const struct tsr_host *h;
  const struct tsr_tensor_info *q[3], *k, *v, *q_pos, *kv_pos, *mask; /* q: per band */
  float scale, softcap;
  int32_t c, temp_from;
  int64_t D, Dv, Nq, Nkv, Hq, Hkv, group;
  struct rows k_rows, v_rows;
  /* decode parameters (struct tsr_decode_params); counters NULL: no skipping */
  float skip_below, budget;
  int32_t sink, recent;
  struct tsr_decode_counters *counters;
};

struct scratch {
  float *q;     /* [3][group][Dp]: the run's query rows per band */
  float *acc;   /* [group][Dvp] */
  float *s;     /* [group][TILE] logits, then weights */
  float *bias;  /* [TILE] mask value per key; -inf hidden */
  uint8_t *band; /* [TILE] 0 intra, 1 successive, 2 inter */
  float *m, *l; /* [group] */
  float *dropped; /* [group] weights of skipped V rows, on l's scale */
  float *cut, *bar; /* [group] a mass budget's cut (logit) and the tile's skipping bar */
  uint8_t *keep; /* [TILE] keys the decode guards keep from skipping */
  float *k, *v; /* a decoded row */
  uint16_t *h16; /* a row a codec decoded to f16 */
  size_t Dp, Dvp;
};

static size_t pad16(int64_t n) { return ((size_t)n + 15) & ~(size_t)15; }

static struct rows rows_of(const struct tsr_tensor_info *t, const struct tsr_kv_codec_v1 *codec) {
  struct rows r = {.dtype = t->dtype, .nb0 = t->nb[0], .codec = codec};
  if (t->dtype == TSR_DTYPE_ID_F32) r.read = t->nb[0] == 4 ? READ_F32 : READ_GATHER;
  else if (t->dtype == TSR_DTYPE_ID_F16) r.read = t->nb[0] == 2 ? READ_F16 : READ_GATHER;
  else r.read = READ_CODEC;
  return r;
}

static float half_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  uint32_t bits;
  if (e == 0x1f) {
    bits = sign | 0x7f800000u | (m << 13);
  } else if (e) {
    bits = sign | ((e + 112) << 23) | (m << 13);
  } else if (m) { /* subnormal: exact as a float */
    const float f = (float)m * (1.0f / 16777216.0f);
    memcpy(&bits, &f, sizeof bits);
    bits |= sign;
  } else {
    bits = sign;
  }
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* A row that is not read in place, as n f32 values. */
static void row_to_f32(const struct rows *r, const struct scratch *s, const char *row, float *out,
                       int64_t n) {
  if (r->read == READ_GATHER) {
    for (int64_t i = 0; i < n; i++) {
      const char *e = row + (size_t)i * r->nb0;
      out[i] =
          r->dtype == TSR_DTYPE_ID_F16 ? half_to_float(*(const uint16_t *)e) : *(const float *)e;
    }
  } else if (r->codec->decode_f32) {
    r->codec->decode_f32(r->codec->ctx, row, out, n);
  } else {
    r->codec->decode_f16(r->codec->ctx, row, s->h16, n);
    for (int64_t i = 0; i < n; i++) out[i] = half_to_float(s->h16[i]);
  }
}

static int32_t pos_at(const struct tsr_tensor_info *t, int64_t i) {
  return *(const int32_t *)((const char *)t->data + (size_t)i * t->nb[0]);
}

static float load_mask(const struct tsr_tensor_info *m, const char *p) {
  return m->dtype == TSR_DTYPE_ID_F16 ? half_to_float(*(const uint16_t *)p) : *(const float *)p;
}

/* Visibility and band of keys [j0, j0+n) for query iq at position qp; the
** same for every head. Returns how many keys are visible. */
static int64_t tile_bias(const struct node *a, const struct scratch *s, int64_t iq, int32_t qp,
                         int64_t j0, int64_t n) {
  const char *mrow = a->mask ? (const char *)a->mask->data + (size_t)iq * a->mask->nb[1] : NULL;
  const int64_t lo_intra = (int64_t)qp / a->c * a->c, lo_succ = lo_intra - a->c;
  int64_t visible = 0;
  for (int64_t t = 0; t < n; t++) {
    const int64_t j = j0 + t;
    float b = mrow ? load_mask(a->mask, mrow + (size_t)j * a->mask->nb[0]) : 0.0f;
    const int32_t kp = pos_at(a->kv_pos, j);
    if (kp < 0 || kp > qp) b = -INFINITY; /* an empty cell, or the future */
    s->band[t] = kp >= lo_intra ? 0 : kp >= lo_succ ? 1 : 2;
    s->bias[t] = b;
    visible += b != -INFINITY;
  }
  return visible;
}

static void tile_logits(const struct node *a, const struct scratch *s, int64_t hk, int64_t nh,
                        int64_t j0, int64_t n, float gain) {
  const struct tsr_host *h = a->h;
  const char *kbase = (const char *)a->k->data + (size_t)hk * a->k->nb[2];
  for (int64_t t = 0; t < n; t++) {
    if (s->bias[t] == -INFINITY) {
      for (int64_t g = 0; g < nh; g++) s->s[g * DCA_TILE + t] = -INFINITY;
      continue;
    }
    const char *krow = kbase + (size_t)(j0 + t) * a->k->nb[1];
    if (a->k_rows.read >= READ_CODEC) row_to_f32(&a->k_rows, s, krow, s->k, a->D);
    const float *qb = s->q + (size_t)s->band[t] * (size_t)a->group * s->Dp;
    for (int64_t g = 0; g < nh; g++) {
      const float *q = qb + (size_t)g * s->Dp;
      float x = a->k_rows.read == READ_F32 ? h->kernel->vec_dot_f32((const float *)krow, q, a->D)
                : a->k_rows.read == READ_F16
                    ? h->kernel->vec_dot_f16_f32((const uint16_t *)krow, q, a->D)
                    : h->kernel->vec_dot_f32(s->k, q, a->D);
      x *= a->scale;
      if (gain != 1.0f) x *= gain;
      if (a->softcap > 0.0f) x = a->softcap * tanhf(x / a->softcap);
      s->s[g * DCA_TILE + t] = x + s->bias[t];
    }
  }
}

/* The V rows of one tile, for tsr_cpu_attn_values. */
struct tile_rows {
  const struct node *a;
  const struct scratch *s;
  const char *vbase;
  int64_t j0;
};

static const void *tile_row(void *ctx, int64_t t, enum tsr_cpu_row_read *how) {
  const struct tile_rows *r = ctx;
  const char *vrow = r->vbase + (size_t)(r->j0 + t) * r->a->v->nb[1];
  switch (r->a->v_rows.read) {
  case READ_F32: *how = TSR_CPU_ROW_F32; return vrow;
  case READ_F16: *how = TSR_CPU_ROW_F16; return vrow;
  default:
    row_to_f32(&r->a->v_rows, r->s, vrow, r->s->v, r->a->Dv);
    *how = TSR_CPU_ROW_DECODED;
    return r->s->v;
  }
}

/* A mass budget's first pass over one unit (tsr_cpu_attn_budget_pass) */
struct unit_pass {
  const struct node *a;
  const struct scratch *s;
  int64_t iq, hk, nh;
  int32_t qp;
  float gain;
};

static int64_t pass_logits(void *ctx, int64_t j0, int64_t n) {
  const struct unit_pass *p = ctx;
  const int64_t visible = tile_bias(p->a, p->s, p->iq, p->qp, j0, n);
  if (visible) tile_logits(p->a, p->s, p->hk, p->nh, j0, n, p->gain);
  return visible;
}

/* Query iq against KV head hk for q heads h0 .. h0+nh-1. */
static void attend_unit(const struct node *a, const struct scratch *s,
                        const struct tsr_tensor_info *dst, int64_t iq, int64_t hk, int64_t h0,
                        int64_t nh) {
  for (int b = 0; b < 3; b++)
    for (int64_t g = 0; g < nh; g++) {
      const char *qrow = (const char *)a->q[b]->data + (size_t)iq * a->q[b]->nb[2] +
                         (size_t)(h0 + g) * a->q[b]->nb[1];
      memcpy(s->q + ((size_t)b * a->group + g) * s->Dp, qrow, (size_t)a->D * sizeof(float));
    }
  for (int64_t g = 0; g < nh; g++) {
    tsr_cpu_attn_start(&s->m[g], &s->l[g], s->acc + (size_t)g * s->Dvp, a->Dv);
    s->dropped[g] = 0.0f;
  }
  const int32_t qp = pos_at(a->q_pos, iq);
  const float gain = dca_logit_gain(qp, a->temp_from);
  const bool budget = a->counters && a->budget > 0.0f;
  if (budget) { /* the first pass: each row's final max and sum, for its cut */
    struct unit_pass p = {a, s, iq, hk, nh, qp, gain};
    tsr_cpu_attn_budget_pass(a->h, a->Nkv, nh, s->s, DCA_TILE, pass_logits, &p, a->budget, s->m,
                             s->l, s->cut);
    for (int64_t g = 0; g < nh; g++)
      tsr_cpu_attn_start(&s->m[g], &s->l[g], s->acc + (size_t)g * s->Dvp, a->Dv);
  }
  struct tsr_cpu_attn_skip skip = {.below = a->skip_below, .below_of = budget ? s->bar : NULL,
                                   .keep = s->keep, .dropped = s->dropped, .dropped_stride = 1};
  for (int64_t j0 = 0; j0 < a->Nkv; j0 += DCA_TILE) {
    const int64_t n = a->Nkv - j0 < DCA_TILE ? a->Nkv - j0 : DCA_TILE;
    if (!tile_bias(a, s, iq, qp, j0, n)) continue;
    tile_logits(a, s, hk, nh, j0, n, gain);
    for (int64_t g = 0; g < nh; g++) {
      tsr_cpu_attn_weights(a->h, s->s + g * DCA_TILE, n, &s->m[g], &s->l[g], &s->dropped[g],
                           s->acc + (size_t)g * s->Dvp, a->Dv);
      if (budget)
        s->bar[g] = tsr_cpu_attn_skip_bar(a->skip_below, a->budget, s->cut[g], s->m[g]);
    }
    if (a->counters) /* the sink and recent guards, by absolute position */
      for (int64_t t = 0; t < n; t++) {
        const int32_t kp = pos_at(a->kv_pos, j0 + t);
        s->keep[t] = kp < a->sink || (int64_t)qp - kp < a->recent;
      }
    struct tile_rows rows = {a, s, (const char *)a->v->data + (size_t)hk * a->v->nb[2], j0};
    tsr_cpu_attn_values(a->h, s->s, DCA_TILE, s->bias, nh, n, s->acc, s->Dvp, a->Dv, tile_row,
                        &rows, a->counters ? &skip : NULL);
  }
  if (a->counters) tsr_cpu_attn_count(a->counters, &skip, s->l, 1, nh);
  for (int64_t g = 0; g < nh; g++)
    tsr_cpu_attn_finish(s->acc + (size_t)g * s->Dvp, s->l[g],
                        (float *)((char *)dst->data + (size_t)(h0 + g) * dst->nb[1] +
                                  (size_t)iq * dst->nb[2]),
                        a->Dv);
}

static void *scratch_new(const struct node *a, struct scratch *s) {
  s->Dp = pad16(a->D), s->Dvp = pad16(a->Dv);
  const size_t group = (size_t)a->group;
  const size_t floats = 3 * group * s->Dp + group * s->Dvp + group * DCA_TILE + DCA_TILE +
                        5 * pad16(a->group) + s->Dp + s->Dvp;
  const size_t bytes =
      floats * sizeof(float) + 2 * DCA_TILE + 2 * (s->Dp > s->Dvp ? s->Dp : s->Dvp);
  float *w = malloc(bytes);
  if (!w) return NULL;
  s->q = w, w += 3 * group * s->Dp;
  s->acc = w, w += group * s->Dvp;
  s->s = w, w += group * DCA_TILE;
  s->bias = w, w += DCA_TILE;
  s->m = w, w += pad16(a->group);
  s->l = w, w += pad16(a->group);
  s->dropped = w, w += pad16(a->group);
  s->cut = w, w += pad16(a->group);
  s->bar = w, w += pad16(a->group);
  s->k = w, w += s->Dp;
  s->v = w, w += s->Dvp;
  s->h16 = (uint16_t *)w;
  s->band = (uint8_t *)(s->h16 + (s->Dp > s->Dvp ? s->Dp : s->Dvp));
  s->keep = s->band + DCA_TILE;
  return s->q;
}

/* Counts what this node served, once (thread 0): the layer, its queries, and
** the queries past the first chunk, where DCA differs from plain attention. */
static void count(const struct node *a, const int32_t *params) {
  const struct dca_state *st = dca_get_ptr(params, DCA_P_STATE);
  if (!st) return;
  uint64_t past = 0;
  for (int64_t i = 0; i < a->Nq; i++) past += pos_at(a->q_pos, i) >= a->c;
  st->host->engaged(st->self, "layers_served", 1);
  st->host->engaged(st->self, "tokens_served", (uint64_t)a->Nq);
  if (past) st->host->engaged(st->self, "tokens_past_first_chunk", past);
}

void dca_attention_cpu(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                       const struct tsr_tensor_info *src, int n_src, const int32_t *params) {
  (void)ctx;
  const struct dca_state *st = dca_get_ptr(params, DCA_P_STATE);
  struct node a = {
      .h = st->host,
      .q = {&src[DCA_SRC_Q], &src[DCA_SRC_Q + 1], &src[DCA_SRC_Q + 2]},
      .k = &src[DCA_SRC_K], .v = &src[DCA_SRC_V], .q_pos = &src[DCA_SRC_Q_POS],
      .kv_pos = &src[DCA_SRC_KV_POS],
      .mask = !dca_has_decode(params) && n_src > DCA_SRC_MASK ? &src[DCA_SRC_MASK] : NULL,
      .c = params[DCA_P_C], .temp_from = params[DCA_P_TEMP],
  };
  memcpy(&a.scale, &params[DCA_P_SCALE], sizeof a.scale);
  memcpy(&a.softcap, &params[DCA_P_SOFTCAP], sizeof a.softcap);
  memcpy(&a.skip_below, &params[DCA_P_SKIP], sizeof a.skip_below);
  memcpy(&a.budget, &params[DCA_P_BUDGET], sizeof a.budget);
  if (dca_has_decode(params) && n_src > DCA_SRC_COUNTERS) {
    a.counters = src[DCA_SRC_COUNTERS].data;
    a.sink = params[DCA_P_SINK], a.recent = params[DCA_P_RECENT];
  }
  a.D = a.q[0]->ne[0];
  a.Dv = a.v->ne[0];
  a.Hq = a.q[0]->ne[1];
  a.Nq = a.q[0]->ne[2];
  a.Nkv = a.k->ne[1];
  a.Hkv = a.k->ne[2];
  a.group = a.Hq / a.Hkv;
  a.k_rows = rows_of(a.k, dca_get_ptr(params, DCA_P_KCODEC));
  a.v_rows = rows_of(a.v, dca_get_ptr(params, DCA_P_VCODEC));
  struct scratch s;
  void *mem = scratch_new(&a, &s);
  if (!mem) abort(); /* a few KB per thread: nothing sensible remains to do */

  /* units as flash splits them: results do not depend on the thread count (V skipping
  ** weighs a group's heads at once: no split) */
  int64_t runs = 1;
  while (!a.counters && runs < a.group && a.Nq * a.Hkv * runs < nth) runs++;
  const int64_t run_len = (a.group + runs - 1) / runs;
  runs = (a.group + run_len - 1) / run_len;
  const int64_t n_units = a.Nq * a.Hkv * runs;
  for (int64_t u = ith; u < n_units; u += nth) {
    const int64_t iq = u / (a.Hkv * runs), hk = u / runs % a.Hkv, r = u % runs;
    const int64_t h0 = hk * a.group + r * run_len;
    const int64_t nh = a.group - r * run_len < run_len ? a.group - r * run_len : run_len;
    attend_unit(&a, &s, dst, iq, hk, h0, nh);
  }
  free(mem);
  if (ith == 0) count(&a, params);
}
