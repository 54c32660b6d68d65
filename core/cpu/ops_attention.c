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
**
** K and V each keep their own dtype. Packed f32 and f16 rows are read in
** place; bf16 and block-quantized rows (q8_0, q4_0, k-quants...) are decoded
** one row at a time into per-thread scratch, once per (tile, run of q heads)
** and only for visible keys, so a step never converts the whole cache.
*/
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "graph/dtype.h"
#include "graph/graph.h"
#include "abi/plugin_host.h"
#include "cpu_ops.h"
#include "tessera/cpu_attn_tile.h"
#include "vec.h"

#define FA_TILE TSR_CPU_ATTN_TILE

/* How a K or V row becomes f32 values the dot and axpy can use. */
enum fa_read {
  FA_IN_PLACE_F32, /* packed f32: used where it lies */
  FA_IN_PLACE_F16, /* packed f16: the f16 dot/axpy read it where it lies */
  FA_DECODE,       /* packed bf16 or whole blocks: to_f32 into scratch */
  FA_GATHER,       /* dim 0 strided (f32, f16, bf16): element by element */
};

struct fa_rows {
  enum fa_read read;
  enum tsr_dtype dtype;
  size_t nb0;
  tsr_to_f32_fn to_f32;
};

static struct fa_rows rows_of(const struct tsr_tensor *t) {
  const struct tsr_dtype_traits *tr = tsr_dtype_traits((int)t->dtype);
  struct fa_rows r = {.dtype = t->dtype, .nb0 = t->nb[0], .to_f32 = tr->to_f32};
  if (t->nb[0] != tr->type_size)
    r.read = FA_GATHER; /* the builder lets only block-size-1 types get here */
  else if (t->dtype == TSR_F32)
    r.read = FA_IN_PLACE_F32;
  else if (t->dtype == TSR_F16)
    r.read = FA_IN_PLACE_F16;
  else
    r.read = FA_DECODE;
  return r;
}

/* Read-only description of one node, shared by every unit it computes. */
struct fa_node {
  const struct tsr_tensor *q, *k, *v, *mask, *q_pos, *kv_pos;
  float scale, softcap;
  bool causal;
  int32_t window;
  int64_t D, Dv, Nq, Nkv, Hq, Hkv, group;
  struct fa_rows k_rows, v_rows;
  size_t qpos_stride, kvpos_stride; /* 0: positions need the general lookup */
  /* decode parameters (plugin.h, struct tsr_decode_params): skip_below and budget 0 are
  ** none; counters NULL: no skipping */
  float skip_below, budget;
  int32_t sink, recent;
  struct tsr_decode_counters *counters;
};

/* Per-thread scratch, carved from c->work. A unit is one query against one
** KV head for a run of the q heads that share it (GQA), so each K and V row
** is loaded once per run rather than once per q head. */
struct fa_scratch {
  float *q;    /* [queries][group][Dp] the unit's query rows, f32 and packed */
  float *acc;  /* [queries][group][Dvp] running sums of p * V rows */
  float *s;    /* [queries][group][FA_TILE] logits of the tile, then their weights */
  float *bias; /* [queries][FA_TILE] mask value per key; -inf for a hidden key */
  float *m, *l; /* [queries][group] running max and running sum */
  float *dropped; /* [queries][group] weights of skipped V rows, on l's scale */
  float *kt, *vt; /* [FA_TILE][Dp], [FA_TILE][Dvp]: a tile's f16 K and V rows as f32 */
  float *cut, *bar; /* [group] a mass budget's cut (logit) and the tile's skipping bar */
  float *k;    /* [D] a K row decoded or gathered, when it cannot be read in place */
  float *v;    /* [Dv] likewise for V */
  uint8_t *keep; /* [FA_TILE] keys the decode guards keep from skipping */
  size_t Dp, Dvp;
};

static size_t pad16(int64_t n) { return ((size_t)n + 15) & ~(size_t)15; }

/* Queries a unit takes together where K and V are f16 rows read in place (prefill): each
** K and V row of a tile is converted to f32 once for all of them and every head. At most
** FA_QB queries and FA_ROWS query rows (queries x the q heads of a KV head), so the rows'
** running sums stay in cache. */
#define FA_QB 16
#define FA_ROWS 32

static int64_t block_queries(int64_t group) {
  const int64_t q = FA_ROWS / group;
  return q < 1 ? 1 : q > FA_QB ? FA_QB : q;
}

size_t tsr_cpu_flash_attn_work(const struct tsr_tensor *dst) {
  const int64_t D = dst->src[0]->ne[0], Dv = dst->ne[0];
  const int64_t group = dst->src[0]->ne[2] / dst->src[1]->ne[2];
  const int64_t rows = block_queries(group) * group;
  const size_t per_row = pad16(D) + pad16(Dv) + FA_TILE;
  return ((size_t)rows * per_row + FA_QB * FA_TILE + 5 * pad16(rows) + pad16(D) + pad16(Dv) +
          FA_TILE * (pad16(D) + pad16(Dv))) *
             sizeof(float) +
         FA_TILE;
}

static struct fa_scratch scratch_carve(const struct tsr_cpu_compute *c, const struct fa_node *a) {
  float *w = c->work;
  struct fa_scratch s;
  const int64_t rows = block_queries(a->group) * a->group;
  s.Dp = pad16(a->D), s.Dvp = pad16(a->Dv);
  s.q = w, w += (size_t)rows * s.Dp;
  s.acc = w, w += (size_t)rows * s.Dvp;
  s.s = w, w += (size_t)rows * FA_TILE;
  s.bias = w, w += FA_QB * FA_TILE;
  s.m = w, w += pad16(rows);
  s.l = w, w += pad16(rows);
  s.dropped = w, w += pad16(rows);
  s.cut = w, w += pad16(rows);
  s.bar = w, w += pad16(rows);
  s.k = w, w += s.Dp;
  s.v = w, w += s.Dvp;
  s.kt = w, w += FA_TILE * s.Dp;
  s.vt = w, w += FA_TILE * s.Dvp;
  s.keep = (uint8_t *)w;
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

/* A row that cannot be read in place, as n f32 values in out. */
static void row_to_f32(const struct fa_rows *r, const char *row, float *out, int64_t n) {
  if (r->read == FA_DECODE) {
    r->to_f32(row, out, n);
  } else if (r->dtype == TSR_BF16) {
    for (int64_t i = 0; i < n; i++)
      out[i] = tsr_bf16_to_f32(*(const uint16_t *)(row + (size_t)i * r->nb0));
  } else {
    gather_row(row, r->nb0, r->dtype == TSR_F16, out, n);
  }
}

static float row_dot(const struct fa_rows *r, const char *row, const float *decoded,
                     const float *q, int64_t n) {
  switch (r->read) {
  case FA_IN_PLACE_F32: return tsr_vec_dot_f32((const float *)row, q, n);
  case FA_IN_PLACE_F16: return tsr_vec_dot_f16_f32((const uint16_t *)row, q, n);
  default: return tsr_vec_dot_f32(decoded, q, n);
  }
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
    if (a->k_rows.read >= FA_DECODE) row_to_f32(&a->k_rows, krow, s->k, a->D);
    for (int64_t g = 0; g < nh; g++) {
      float x = row_dot(&a->k_rows, krow, s->k, s->q + (size_t)g * s->Dp, a->D);
      x *= a->scale;
      if (a->softcap > 0.0f) x = a->softcap * tanhf(x / a->softcap);
      s->s[g * FA_TILE + t] = x + s->bias[t];
    }
  }
}

/* The V rows of one tile, for tsr_cpu_attn_values. */
struct fa_tile_rows {
  const struct fa_node *a;
  const struct fa_scratch *s;
  const char *vbase;
  int64_t j0;
};

static const void *tile_row(void *ctx, int64_t t, enum tsr_cpu_row_read *how) {
  const struct fa_tile_rows *r = ctx;
  const char *vrow = r->vbase + (size_t)(r->j0 + t) * r->a->v->nb[1];
  switch (r->a->v_rows.read) {
  case FA_IN_PLACE_F32: *how = TSR_CPU_ROW_F32; return vrow;
  case FA_IN_PLACE_F16: *how = TSR_CPU_ROW_F16; return vrow;
  default:
    row_to_f32(&r->a->v_rows, vrow, r->s->v, r->a->Dv);
    *how = TSR_CPU_ROW_DECODED;
    return r->s->v;
  }
}

static void tile_values(const struct fa_node *a, const struct fa_scratch *s, int64_t hk,
                        int64_t nh, int64_t j0, int64_t n, int32_t qp,
                        struct tsr_cpu_attn_skip *skip) {
  struct fa_tile_rows rows = {a, s, (const char *)a->v->data + (size_t)hk * a->v->nb[2], j0};
  if (skip) /* the sink and recent guards */
    for (int64_t t = 0; t < n; t++) {
      const int32_t kp = pos_at(a->kv_pos, a->kvpos_stride, j0 + t);
      s->keep[t] = kp < a->sink || (int64_t)qp - kp < a->recent;
    }
  tsr_cpu_attn_values(tsr_plugin_host_services(), s->s, FA_TILE, s->bias, nh, n, s->acc, s->Dvp,
                      a->Dv, tile_row, &rows, skip);
}

/* A mass budget's first pass over one unit (tsr_cpu_attn_budget_pass) */
struct fa_pass {
  const struct fa_node *a;
  const struct fa_scratch *s;
  int64_t iq, hk, nh;
  int32_t qp;
};

static int64_t pass_logits(void *ctx, int64_t j0, int64_t n) {
  const struct fa_pass *p = ctx;
  const int64_t visible = tile_bias(p->a, p->s->bias, p->iq, p->qp, j0, n);
  if (visible) tile_logits(p->a, p->s, p->hk, p->nh, j0, n);
  return visible;
}

/* Query iq against KV head hk for q heads h0 .. h0+nh-1. */
static void attend_unit(const struct fa_node *a, const struct fa_scratch *s,
                        struct tsr_tensor *dst, int64_t iq, int64_t hk, int64_t h0, int64_t nh) {
  for (int64_t g = 0; g < nh; g++) {
    const char *qrow =
        (const char *)a->q->data + (size_t)iq * a->q->nb[1] + (size_t)(h0 + g) * a->q->nb[2];
    gather_row(qrow, a->q->nb[0], false, s->q + (size_t)g * s->Dp, a->D);
    tsr_cpu_attn_start(&s->m[g], &s->l[g], s->acc + (size_t)g * s->Dvp, a->Dv);
  }
  const struct tsr_host *h = tsr_plugin_host_services();
  const int32_t qp = a->q_pos ? pos_at(a->q_pos, a->qpos_stride, iq) : 0;
  const bool budget = a->counters && a->budget > 0.0f;
  if (budget) { /* the first pass: each row's final max and sum, for its cut */
    struct fa_pass p = {a, s, iq, hk, nh, qp};
    tsr_cpu_attn_budget_pass(h, a->Nkv, nh, s->s, FA_TILE, pass_logits, &p, a->budget, s->m,
                             s->l, s->cut);
    for (int64_t g = 0; g < nh; g++)
      tsr_cpu_attn_start(&s->m[g], &s->l[g], s->acc + (size_t)g * s->Dvp, a->Dv);
  }
  struct tsr_cpu_attn_skip skip = {.below = a->skip_below, .below_of = budget ? s->bar : NULL,
                                   .keep = s->keep, .dropped = s->dropped, .dropped_stride = 1};
  for (int64_t g = 0; g < nh; g++) s->dropped[g] = 0.0f;
  for (int64_t j0 = 0; j0 < a->Nkv; j0 += FA_TILE) {
    const int64_t n = a->Nkv - j0 < FA_TILE ? a->Nkv - j0 : FA_TILE;
    if (!tile_bias(a, s->bias, iq, qp, j0, n)) continue; /* m, l and acc stay put */
    tile_logits(a, s, hk, nh, j0, n);
    for (int64_t g = 0; g < nh; g++) {
      tsr_cpu_attn_weights(h, s->s + g * FA_TILE, n, &s->m[g], &s->l[g], &s->dropped[g],
                           s->acc + (size_t)g * s->Dvp, a->Dv);
      if (budget)
        s->bar[g] = tsr_cpu_attn_skip_bar(a->skip_below, a->budget, s->cut[g], s->m[g]);
    }
    tile_values(a, s, hk, nh, j0, n, qp, a->counters ? &skip : NULL);
  }
  if (a->counters) tsr_cpu_attn_count(a->counters, &skip, s->l, 1, nh);
  for (int64_t g = 0; g < nh; g++)
    tsr_cpu_attn_finish(s->acc + (size_t)g * s->Dvp, s->l[g],
                        (float *)((char *)dst->data + (size_t)(h0 + g) * dst->nb[1] +
                                  (size_t)iq * dst->nb[2]),
                        a->Dv);
}

/* Queries iq0 .. iq0+nq-1 (nq <= block_queries) against KV head hk for all its q heads, K and
** V f16 rows read in place, no V skipping: each query's arithmetic is attend_unit's to the bit
** (the dot and axpy over converted rows round as over the f16 ones: vec.h), but each K and
** V row a tile shows any of them is converted once, a few keys' dots go together and the
** weighted V rows are summed with the row's sums held in registers. Row r = b * group + g. */
static void attend_block(const struct fa_node *a, const struct fa_scratch *s,
                         struct tsr_tensor *dst, int64_t iq0, int64_t nq, int64_t hk) {
  const int64_t G = a->group, R = nq * G;
  const struct tsr_host *h = tsr_plugin_host_services();
  int32_t qp[FA_QB];
  for (int64_t b = 0; b < nq; b++) {
    qp[b] = a->q_pos ? pos_at(a->q_pos, a->qpos_stride, iq0 + b) : 0;
    for (int64_t g = 0; g < G; g++) {
      const int64_t r = b * G + g;
      const char *qrow = (const char *)a->q->data + (size_t)(iq0 + b) * a->q->nb[1] +
                         (size_t)(hk * G + g) * a->q->nb[2];
      gather_row(qrow, a->q->nb[0], false, s->q + (size_t)r * s->Dp, a->D);
      tsr_cpu_attn_start(&s->m[r], &s->l[r], s->acc + (size_t)r * s->Dvp, a->Dv);
      s->dropped[r] = 0.0f;
    }
  }
  const char *kbase = (const char *)a->k->data + (size_t)hk * a->k->nb[2];
  const char *vbase = (const char *)a->v->data + (size_t)hk * a->v->nb[2];
  for (int64_t j0 = 0; j0 < a->Nkv; j0 += FA_TILE) {
    const int64_t n = a->Nkv - j0 < FA_TILE ? a->Nkv - j0 : FA_TILE;
    int64_t visible[FA_QB], any = 0;
    for (int64_t b = 0; b < nq; b++)
      any += visible[b] = tile_bias(a, s->bias + b * FA_TILE, iq0 + b, qp[b], j0, n);
    if (!any) continue;
    for (int64_t t = 0; t < n; t++) {
      bool seen = false;
      for (int64_t b = 0; b < nq; b++) seen |= s->bias[b * FA_TILE + t] != -INFINITY;
      if (!seen) continue;
      const size_t j = (size_t)(j0 + t);
      a->k_rows.to_f32(kbase + j * a->k->nb[1], s->kt + (size_t)t * s->Dp, a->D);
      a->v_rows.to_f32(vbase + j * a->v->nb[1], s->vt + (size_t)t * s->Dvp, a->Dv);
    }
    for (int64_t b = 0; b < nq; b++) {
      if (!visible[b]) continue; /* m, l and acc stay put, as attend_unit's */
      const float *bias = s->bias + b * FA_TILE;
      int64_t seen[FA_TILE], n_seen = 0;
      for (int64_t t = 0; t < n; t++)
        if (bias[t] != -INFINITY) seen[n_seen++] = t;
      for (int64_t g = 0; g < G; g++) {
        const int64_t r = b * G + g;
        float *x = s->s + (size_t)r * FA_TILE;
        for (int64_t t = 0; t < n; t++) x[t] = -INFINITY;
        /* the visible keys' dots a few at a time, each one's bits as alone */
        for (int64_t i = 0; i < n_seen; i += TSR_VEC_DOTS_MAX) {
          const int nk = n_seen - i < TSR_VEC_DOTS_MAX ? (int)(n_seen - i) : TSR_VEC_DOTS_MAX;
          const float *keys[TSR_VEC_DOTS_MAX];
          float dots[TSR_VEC_DOTS_MAX];
          for (int j = 0; j < nk; j++) keys[j] = s->kt + (size_t)seen[i + j] * s->Dp;
          tsr_vec_dots_f32_as_f16(keys, nk, s->q + (size_t)r * s->Dp, a->D, dots);
          for (int j = 0; j < nk; j++) {
            float v = dots[j] * a->scale;
            if (a->softcap > 0.0f) v = a->softcap * tanhf(v / a->softcap);
            x[seen[i + j]] = v + bias[seen[i + j]];
          }
        }
        tsr_cpu_attn_weights(h, x, n, &s->m[r], &s->l[r], &s->dropped[r],
                             s->acc + (size_t)r * s->Dvp, a->Dv);
        /* a hidden key weighs exactly 0, so the run skips it as tsr_cpu_attn_values does */
        tsr_vec_axpy_run_f32(s->acc + (size_t)r * s->Dvp, x, s->vt, s->Dvp, n, a->Dv);
      }
    }
  }
  for (int64_t r = 0; r < R; r++)
    tsr_cpu_attn_finish(s->acc + (size_t)r * s->Dvp, s->l[r],
                        (float *)((char *)dst->data + (size_t)(hk * G + r % G) * dst->nb[1] +
                                  (size_t)(iq0 + r / G) * dst->nb[2]),
                        a->Dv);
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
      .skip_below = tsr_param_f32(dst, TSR_FA_P_SKIP),
      .budget = tsr_param_f32(dst, TSR_FA_P_BUDGET),
      .sink = dst->op_params[TSR_FA_P_SINK],
      .recent = dst->op_params[TSR_FA_P_RECENT],
  };
  /* V skipping (the graph gives it the keys' positions, for its guards) */
  if ((a.skip_below > 0.0f || a.budget > 0.0f) && dst->src[TSR_FA_SRC_COUNTERS] && a.kv_pos)
    a.counters = dst->src[TSR_FA_SRC_COUNTERS]->data;
  a.D = a.q->ne[0];
  a.Dv = a.v->ne[0];
  a.Nq = a.q->ne[1];
  a.Hq = a.q->ne[2];
  a.Nkv = a.k->ne[1];
  a.Hkv = a.k->ne[2];
  a.group = a.Hq / a.Hkv;
  a.k_rows = rows_of(a.k);
  a.v_rows = rows_of(a.v);
  a.qpos_stride = pos_stride(a.q_pos);
  a.kvpos_stride = pos_stride(a.kv_pos);
  const struct fa_scratch s = scratch_carve(c, &a);

  /* Several queries with f16 K and V (prefill): units of a block of queries and a KV head,
  ** the blocks small enough that every thread gets a unit, the units to whichever thread is
  ** free (a later block of a causal prefill sees more keys) */
  if (!a.counters && a.Nq > 1 && a.k_rows.read == FA_IN_PLACE_F16 &&
      a.v_rows.read == FA_IN_PLACE_F16 && a.Nq * a.Hkv >= c->nth) {
    int64_t qb = block_queries(a.group);
    const int64_t want = (c->nth + a.Hkv - 1) / a.Hkv; /* blocks that give every thread one */
    if ((a.Nq + qb - 1) / qb < want) qb = a.Nq / want > 1 ? a.Nq / want : 1;
    const int64_t units = (a.Nq + qb - 1) / qb * a.Hkv;
    for (int64_t u; (u = tsr_cpu_take(c, units)) < units;) {
      const int64_t iq0 = u / a.Hkv * qb, hk = u % a.Hkv;
      attend_block(&a, &s, dst, iq0, a.Nq - iq0 < qb ? a.Nq - iq0 : qb, hk);
    }
    return;
  }
  /* Split each group into runs only as far as it takes to give every thread
  ** a unit (decode with few KV heads); each head's arithmetic is the same
  ** whatever the split, so results do not depend on the thread count. V
  ** skipping weighs every head of a group at once: no split. */
  int64_t runs = 1;
  while (!a.counters && runs < a.group && a.Nq * a.Hkv * runs < c->nth) runs++;
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
