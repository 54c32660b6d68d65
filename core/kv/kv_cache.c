/*
** The KV cache: layout and bytes, cells and the sliding ring, sequences and
** state slots. The graph wiring (store, views) is in kv_cache_graph.c. See
** kv_cache.h for the design.
*/
#include "kv/kv_cache_internal.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/error.h"

static uint64_t align64(uint64_t n) { return (n + 63) & ~(uint64_t)63; }

/* a * b * c rounded up to 64 bytes, or 0 with an error on overflow */
static int bytes3(size_t a, size_t b, size_t c, uint64_t *out) {
  size_t ab, abc, r;
  if (!tsr_size_mul(a, b, &ab) || !tsr_size_mul(ab, c, &abc) || !tsr_size_add(abc, 63, &r))
    return 0;
  *out = align64(abc);
  return 1;
}

static tsr_status row_bytes(int32_t layer, const char *side, int32_t head_dim,
                            const struct tsr_kv_codec_v1 *codec, size_t *out) {
  if (!codec)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "layer %d: no %s codec", layer, side);
  if (codec->block_size < 1 || codec->block_bytes < 1)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "layer %d: %s codec %s has blocks of %lld values "
                         "in %zu bytes", layer, side, codec->name, (long long)codec->block_size,
                         codec->block_bytes);
  if (head_dim < 1 || head_dim % codec->block_size)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "layer %d: %s head dim %d is not a multiple of "
                         "codec %s's block of %lld values", layer, side, head_dim, codec->name,
                         (long long)codec->block_size);
  *out = (size_t)(head_dim / codec->block_size) * codec->block_bytes;
  return TSR_OK;
}

int32_t tsr_kv_codec_storage_dim(const struct tsr_kv_codec_v1 *codec, int32_t head_dim) {
  int32_t (*fn)(void *, int32_t) = codec ? codec->storage_dim : NULL;
  if (!fn) return head_dim;
  const int32_t s = fn(codec->ctx, head_dim);
  return s >= head_dim && codec->block_size > 0 && s % codec->block_size == 0 ? s : 0;
}

static tsr_status storage_dim(int32_t layer, const char *side, int32_t head_dim,
                              const struct tsr_kv_codec_v1 *codec, int32_t *out) {
  if (!codec) return tsr_error_set(TSR_ERR_INVALID_ARG, "layer %d: no %s codec", layer, side);
  *out = tsr_kv_codec_storage_dim(codec, head_dim);
  if (*out == 0)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "layer %d: %s codec %s cannot store head dim %d",
                         layer, side, codec->name, head_dim);
  return TSR_OK;
}

/* Checks one shared layer against its source. */
static tsr_status check_shared(const struct tsr_arch_layer *layers, int32_t n_layers, int32_t i) {
  const struct tsr_arch_layer *l = &layers[i];
  int32_t j = l->kv_shared_from - 1;
  if (j < 0 || j >= n_layers || j == i)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "layer %d: reads the K/V of layer %d, which does "
                         "not exist", i, j);
  /* the source must come first: its K/V are written before this layer reads them */
  if (j > i)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "layer %d: reads the K/V of the later layer %d", i,
                         j);
  const struct tsr_arch_layer *s = &layers[j];
  if (s->kv_shared_from || s->kind == TSR_LAYER_LINEAR)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "layer %d: reads the K/V of layer %d, which owns "
                         "none", i, j);
  if (s->kind != l->kind || s->n_head_kv != l->n_head_kv || s->head_dim_k != l->head_dim_k ||
      s->head_dim_v != l->head_dim_v)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "layer %d: reads the K/V of layer %d, whose kind "
                         "or kv heads/head dims differ", i, j);
  return TSR_OK;
}

/* The codec's persistent state on one side of an owning layer: the dims and
** bytes of each tensor, as its state_shape says. */
static tsr_status codec_state_layout(int32_t layer, int side, const struct tsr_kv_codec_v1 *c,
                                     struct tsr_kv__layer *y) {
  const char *label = side ? "V" : "K";
  const int32_t n = c->n_state;
  if (n < 0 || n > TSR_KV_CODEC_MAX_STATE || (n && !c->state_shape))
    return tsr_error_set(TSR_ERR_INVALID_ARG, "layer %d: %s codec %s declares %d state tensors "
                         "(0..%d, with state_shape)", layer, label, c->name, n,
                         TSR_KV_CODEC_MAX_STATE);
  y->codec_n_state[side] = n;
  for (int32_t i = 0; i < n; i++) {
    const char *name = NULL;
    int64_t *ne = y->codec_state_ne[side][i];
    ne[0] = ne[1] = 0;
    tsr_status st = c->state_shape(c->ctx, side ? y->desc.head_dim_v : y->desc.head_dim_k,
                                   y->desc.n_head_kv, side == 0, i, &name, ne);
    if (st != TSR_OK) {
      tsr_error_prefix("layer %d: %s codec %s, state tensor %d", layer, label, c->name, i);
      return st;
    }
    if (ne[0] < 1 || ne[1] < 1 || ne[0] > (1 << 24) || ne[1] > (1 << 24))
      return tsr_error_set(TSR_ERR_INVALID_ARG, "layer %d: %s codec %s's state tensor %d (%s) has "
                           "dims %lld x %lld (each 1..2^24)", layer, label, c->name, i,
                           name ? name : "?", (long long)ne[0], (long long)ne[1]);
    y->codec_state_bytes[side][i] = align64((uint64_t)ne[0] * (uint64_t)ne[1] * sizeof(float));
  }
  return TSR_OK;
}

/* The whole layout, without allocating: what plan_bytes sums and new
** allocates. lay has n_layers entries. */
tsr_status tsr_kv__layout(const struct tsr_arch_layer *layers, int32_t n_layers,
                          const struct tsr_kv_layer_codecs *codecs,
                          const struct tsr_kv_cache_params *p, struct tsr_kv__layer *lay,
                          struct tsr_kv__pool *pools, struct tsr_kv_plan *plan) {
  memset(plan, 0, sizeof *plan);
  memset(pools, 0, sizeof *pools * TSR_KV_POOL_COUNT);
  if (!p || p->n_ctx < 1 || p->n_seq < 1 || p->n_seq > TSR_KV_MAX_SEQ || p->n_ubatch < 1)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "kv cache: n_ctx %d, n_seq %d (1..%d), n_ubatch %d",
                         p ? p->n_ctx : 0, p ? p->n_seq : 0, TSR_KV_MAX_SEQ,
                         p ? p->n_ubatch : 0);
  if (n_layers < 0 || (n_layers && (!layers || !codecs)))
    return tsr_error_set(TSR_ERR_INVALID_ARG, "kv cache: %d layers without a plan", n_layers);
  int32_t window = 0;
  bool has_sliding = false;
  for (int32_t i = 0; i < n_layers; i++) {
    const struct tsr_arch_layer *l = &layers[i];
    if (l->kind == TSR_LAYER_SLIDING) {
      if (l->window < 1)
        return tsr_error_set(TSR_ERR_INVALID_ARG, "layer %d: sliding window %d", i, l->window);
      if (l->window > window) window = l->window;
      has_sliding = true;
    }
  }
  pools[TSR_KV_POOL_FULL].n_cells = p->n_ctx;
  if (has_sliding) {
    int64_t ring = (int64_t)p->n_seq * ((int64_t)window + p->n_ubatch);
    pools[TSR_KV_POOL_SLIDING].n_cells = (int32_t)(ring < p->n_ctx ? ring : p->n_ctx);
    pools[TSR_KV_POOL_SLIDING].window = window;
  }
  plan->window = window;
  for (int pl = 0; pl < TSR_KV_POOL_COUNT; pl++) {
    struct tsr_kv__pool *q = &pools[pl];
    if (!q->n_cells) continue;
    q->meta_bytes[0] = align64((uint64_t)q->n_cells * sizeof(int32_t));
    q->meta_bytes[1] = align64((uint64_t)q->n_cells * sizeof(uint64_t));
    q->meta_bytes[2] = align64((uint64_t)p->n_ubatch * sizeof(int32_t));
    enum tsr_layer_kind kind = pl == TSR_KV_POOL_FULL ? TSR_LAYER_FULL : TSR_LAYER_SLIDING;
    plan->kind_bytes[kind] += q->meta_bytes[0] + q->meta_bytes[1] + q->meta_bytes[2];
  }
  for (int32_t i = 0; i < n_layers; i++) {
    const struct tsr_arch_layer *l = &layers[i];
    struct tsr_kv__layer *y = &lay[i];
    memset(y, 0, sizeof *y);
    y->desc = *l;
    y->pool = -1;
    y->owner = i;
    if (l->kind == TSR_LAYER_LINEAR) {
      if (l->kv_shared_from)
        return tsr_error_set(TSR_ERR_INVALID_ARG, "layer %d: a linear layer cannot share K/V", i);
      if (l->state_bytes < 4 || l->state_bytes % 4)
        return tsr_error_set(TSR_ERR_INVALID_ARG, "layer %d: state of %lld bytes is not whole "
                             "f32 values", i, (long long)l->state_bytes);
      if (!bytes3((size_t)l->state_bytes, (size_t)p->n_seq, 1, &y->state_bytes))
        return tsr_error_set(TSR_ERR_NOMEM, "layer %d: state size overflows", i);
      if (p->n_checkpoints < 0 || p->n_checkpoints > p->n_ubatch)
        return tsr_error_set(TSR_ERR_INVALID_ARG, "kv cache: %d checkpoint rows (0..n_ubatch %d)",
                             p->n_checkpoints, p->n_ubatch);
      if (!bytes3((size_t)l->state_bytes, (size_t)p->n_checkpoints, 1, &y->ckpt_bytes))
        return tsr_error_set(TSR_ERR_NOMEM, "layer %d: checkpoint size overflows", i);
      plan->kind_bytes[TSR_LAYER_LINEAR] += y->state_bytes + y->ckpt_bytes;
      plan->kind_cells[TSR_LAYER_LINEAR] = (uint64_t)p->n_seq;
      continue;
    }
    if (l->kind != TSR_LAYER_FULL && l->kind != TSR_LAYER_SLIDING)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "layer %d: unknown kind %d", i, (int)l->kind);
    int pool = l->kind == TSR_LAYER_SLIDING ? TSR_KV_POOL_SLIDING : TSR_KV_POOL_FULL;
    if (l->kv_shared_from < 0) continue; /* reads the paired target model's K/V: nothing here */
    if (l->kv_shared_from > 0) {
      tsr_status st = check_shared(layers, n_layers, i);
      if (st != TSR_OK) return st;
      y->owner = l->kv_shared_from - 1;
      y->pool = pool;
      continue;
    }
    if (l->n_head_kv < 1)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "layer %d: %d kv heads", i, l->n_head_kv);
    y->pool = pool;
    y->kc = codecs[i].k;
    y->vc = codecs[i].v;
    y->k_lift = codecs[i].k_lift;
    y->v_lift = codecs[i].v_lift;
    /* rows are stored at the codecs' storage dims: desc holds what the cache holds */
    tsr_status st = storage_dim(i, "K", l->head_dim_k, y->kc, &y->desc.head_dim_k);
    if (st == TSR_OK) st = storage_dim(i, "V", l->head_dim_v, y->vc, &y->desc.head_dim_v);
    if (st == TSR_OK) st = row_bytes(i, "K", y->desc.head_dim_k, y->kc, &y->k_row);
    if (st == TSR_OK) st = row_bytes(i, "V", y->desc.head_dim_v, y->vc, &y->v_row);
    if (st != TSR_OK) return st;
    size_t cells = (size_t)pools[pool].n_cells, heads = (size_t)l->n_head_kv;
    if (!bytes3(y->k_row, cells, heads, &y->k_bytes) ||
        !bytes3(y->v_row, cells, heads, &y->v_bytes))
      return tsr_error_set(TSR_ERR_NOMEM, "layer %d: K/V size overflows", i);
    plan->kind_bytes[l->kind] += y->k_bytes + y->v_bytes;
    plan->kind_cells[l->kind] = cells;
    for (int side = 0; side < 2; side++) {
      if ((st = codec_state_layout(i, side, side ? y->vc : y->kc, y)) != TSR_OK) return st;
      for (int32_t j = 0; j < y->codec_n_state[side]; j++)
        plan->kind_bytes[l->kind] += y->codec_state_bytes[side][j];
    }
  }
  for (int k = 0; k < TSR_LAYER_KIND_COUNT; k++) plan->bytes += plan->kind_bytes[k];
  return TSR_OK;
}

tsr_status tsr_kv_cache_plan_bytes(const struct tsr_arch_layer *layers, int32_t n_layers,
                                   const struct tsr_kv_layer_codecs *codecs,
                                   const struct tsr_kv_cache_params *params,
                                   struct tsr_kv_plan *out) {
  struct tsr_kv__layer *lay = calloc(n_layers > 0 ? (size_t)n_layers : 1, sizeof *lay);
  if (!lay) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  struct tsr_kv__pool pools[TSR_KV_POOL_COUNT];
  tsr_status st = tsr_kv__layout(layers, n_layers, codecs, params, lay, pools, out);
  free(lay);
  return st;
}

/* ---- allocation ------------------------------------------------------------ */

/* A zeroed, page-aligned block of bytes, counted: the kernel's zero pages, so a cell costs
** the host memory once written. A cache planned for 1M tokens then holds what has been
** filled, and on a device backend (whose own copy is the one written) next to nothing,
** where zeroing it up front made every page resident: 8,932 MiB of host memory in the 1M
** run. */
static void *alloc_counted(struct tsr_kv_cache *c, uint64_t bytes, bool *fail) {
  if (!bytes) return NULL;
  void *p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    *fail = true;
    return NULL;
  }
  c->bytes += bytes;
  return p;
}

static void free_counted(void *p, uint64_t bytes) {
  if (p) munmap(p, (size_t)bytes);
}

tsr_status tsr_kv_cache_new(const struct tsr_arch_layer *layers, int32_t n_layers,
                            const struct tsr_kv_layer_codecs *codecs,
                            const struct tsr_kv_cache_params *params, struct tsr_kv_cache **out) {
  *out = NULL;
  struct tsr_kv_cache *c = calloc(1, sizeof *c);
  if (!c) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  for (int s = 0; s < TSR_KV_MAX_SEQ; s++) c->released[s] = -1;
  c->layers = calloc(n_layers > 0 ? (size_t)n_layers : 1, sizeof *c->layers);
  if (!c->layers) {
    free(c);
    return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  }
  c->n_layers = n_layers;
  struct tsr_kv_plan plan;
  tsr_status st = tsr_kv__layout(layers, n_layers, codecs, params, c->layers, c->pools, &plan);
  if (st != TSR_OK) {
    tsr_kv_cache_free(c);
    return st;
  }
  c->params = *params;
  bool fail = false;
  for (int pl = 0; pl < TSR_KV_POOL_COUNT; pl++) {
    struct tsr_kv__pool *q = &c->pools[pl];
    if (!q->n_cells) continue;
    q->pos = alloc_counted(c, q->meta_bytes[0], &fail);
    q->seqs = alloc_counted(c, q->meta_bytes[1], &fail);
    q->slots = alloc_counted(c, q->meta_bytes[2], &fail);
    if (q->pos)
      for (int32_t i = 0; i < q->n_cells; i++) q->pos[i] = -1;
  }
  for (int32_t i = 0; i < n_layers; i++) {
    struct tsr_kv__layer *y = &c->layers[i];
    if (y->desc.kind == TSR_LAYER_LINEAR) {
      y->state = alloc_counted(c, y->state_bytes, &fail);
      if (y->ckpt_bytes) y->ckpt = alloc_counted(c, y->ckpt_bytes, &fail);
      c->has_linear = true;
    } else {
      y->k = alloc_counted(c, y->k_bytes, &fail);
      y->v = alloc_counted(c, y->v_bytes, &fail);
      for (int side = 0; side < 2; side++)
        for (int32_t j = 0; j < y->codec_n_state[side]; j++)
          y->codec_state[side][j] = alloc_counted(c, y->codec_state_bytes[side][j], &fail);
    }
  }
  /* each codec's state, from its state_init (the mapping is zeros already) */
  for (int32_t i = 0; i < n_layers && !fail && st == TSR_OK; i++) {
    const struct tsr_kv__layer *y = &c->layers[i];
    for (int side = 0; side < 2 && st == TSR_OK; side++) {
      const struct tsr_kv_codec_v1 *codec = side ? y->vc : y->kc;
      for (int32_t j = 0; j < y->codec_n_state[side] && codec->state_init && st == TSR_OK; j++) {
        const int64_t *ne = y->codec_state_ne[side][j];
        st = codec->state_init(codec->ctx, i, side == 0, j, y->codec_state[side][j], ne[0] * ne[1]);
        if (st != TSR_OK)
          tsr_error_prefix("layer %d: %s codec %s, state tensor %d", i, side ? "V" : "K",
                           codec->name, j);
      }
    }
  }
  if (st != TSR_OK) {
    tsr_kv_cache_free(c);
    return st;
  }
  if (fail) {
    uint64_t want = plan.bytes;
    tsr_kv_cache_free(c);
    return tsr_error_set(TSR_ERR_NOMEM, "out of memory allocating the KV cache (%.2f MiB)",
                         want / 1048576.0);
  }
  *out = c;
  return TSR_OK;
}

void tsr_kv_cache_zero_rows(struct tsr_kv_cache *c, const struct tsr_kv_slots *s) {
  for (int32_t i = 0; i < c->n_layers; i++) {
    const struct tsr_kv__layer *y = &c->layers[i];
    if (y->pool < 0 || y->owner != i || !y->k) continue;
    const int64_t cells = c->pools[y->pool].n_cells;
    for (int32_t h = 0; h < y->desc.n_head_kv; h++) /* rows [head_dim, cells, heads] */
      for (int32_t j = 0; j < s->n; j++) {
        const int64_t row = h * cells + s->cells[y->pool][j];
        memset((char *)y->k + row * (int64_t)y->k_row, 0, y->k_row);
        memset((char *)y->v + row * (int64_t)y->v_row, 0, y->v_row);
      }
  }
}

void tsr_kv_cache_free(struct tsr_kv_cache *c) {
  if (!c) return;
  for (int pl = 0; pl < TSR_KV_POOL_COUNT; pl++) {
    const struct tsr_kv__pool *q = &c->pools[pl];
    free_counted(q->pos, q->meta_bytes[0]);
    free_counted(q->seqs, q->meta_bytes[1]);
    free_counted(q->slots, q->meta_bytes[2]);
  }
  for (int32_t i = 0; i < c->n_layers; i++) {
    const struct tsr_kv__layer *y = &c->layers[i];
    free_counted(y->k, y->k_bytes);
    free_counted(y->v, y->v_bytes);
    free_counted(y->state, y->state_bytes);
    free_counted(y->ckpt, y->ckpt_bytes);
    for (int side = 0; side < 2; side++)
      for (int32_t j = 0; j < y->codec_n_state[side]; j++)
        free_counted(y->codec_state[side][j], y->codec_state_bytes[side][j]);
  }
  free(c->layers);
  free(c);
}

uint64_t tsr_kv_cache_bytes(const struct tsr_kv_cache *c) { return c ? c->bytes : 0; }

int32_t tsr_kv_cache_n_cells(const struct tsr_kv_cache *c, enum tsr_kv_pool pool) {
  return pool >= 0 && pool < TSR_KV_POOL_COUNT ? c->pools[pool].n_cells : 0;
}

int32_t tsr_kv_cache_span(struct tsr_kv_cache *c, enum tsr_kv_pool pool) {
  if (pool < 0 || pool >= TSR_KV_POOL_COUNT) return 0;
  struct tsr_kv__pool *q = &c->pools[pool];
  while (q->hi > 0 && q->pos[q->hi - 1] < 0) q->hi--;
  int32_t span = (q->hi + TSR_KV_SPAN_STEP - 1) / TSR_KV_SPAN_STEP * TSR_KV_SPAN_STEP;
  if (span < TSR_KV_SPAN_STEP) span = TSR_KV_SPAN_STEP;
  return span < q->n_cells ? span : q->n_cells;
}

int tsr_kv_cache_layer_pool(const struct tsr_kv_cache *c, int32_t layer) {
  return layer >= 0 && layer < c->n_layers ? c->layers[layer].pool : -1;
}

void tsr_kv_cache_layer_lifts(const struct tsr_kv_cache *c, int32_t layer, bool *k, bool *v) {
  *k = *v = false;
  if (layer < 0 || layer >= c->n_layers || c->layers[layer].pool < 0) return;
  const struct tsr_kv__layer *y = &c->layers[c->layers[layer].owner];
  *k = y->k_lift;
  *v = y->v_lift;
}

void tsr_kv_cache_layer_codecs(const struct tsr_kv_cache *c, int32_t layer,
                               const struct tsr_kv_codec_v1 **k, const struct tsr_kv_codec_v1 **v) {
  *k = *v = NULL;
  if (layer < 0 || layer >= c->n_layers || c->layers[layer].pool < 0) return;
  const struct tsr_kv__layer *y = &c->layers[c->layers[layer].owner];
  *k = y->kc;
  *v = y->vc;
}

/* Cell i of q loses its last sequence. */
static void cell_free(struct tsr_kv__pool *q, int32_t i) {
  if (q->pos[i] >= 0) q->n_used--;
  q->pos[i] = -1;
  q->seqs[i] = 0;
  if (i < q->free_hint) q->free_hint = i;
}

static bool pool_used(const struct tsr_kv_cache *c, int pool) {
  for (int32_t i = 0; i < c->n_layers; i++)
    if (c->layers[i].pool == pool) return true;
  return false;
}

int32_t tsr_kv_cache_cell_pos(const struct tsr_kv_cache *c, enum tsr_kv_pool pool, int32_t cell) {
  const struct tsr_kv__pool *q = &c->pools[pool];
  return cell >= 0 && cell < q->n_cells ? q->pos[cell] : -1;
}

uint64_t tsr_kv_cache_cell_seqs(const struct tsr_kv_cache *c, enum tsr_kv_pool pool,
                                int32_t cell) {
  const struct tsr_kv__pool *q = &c->pools[pool];
  return cell >= 0 && cell < q->n_cells ? q->seqs[cell] : 0;
}

/* ---- one step ---------------------------------------------------------------- */

/* Whether no query of this batch or a later one can see the ring's cell
** (the release rule in kv_cache.h). */
static bool ring_dead(const struct tsr_kv__pool *q, int32_t cell, uint64_t in_batch,
                      const int64_t *p_min) {
  if (q->pos[cell] < 0) return true;
  uint64_t m = q->seqs[cell];
  if (m & ~in_batch) return false;
  for (; m; m &= m - 1) {
    int s = __builtin_ctzll(m);
    if ((int64_t)q->pos[cell] > p_min[s] - q->window) return false;
  }
  return true;
}

/* Sequence s lets go of ring cell i (its released position moves up to it); the
** cell is freed when no sequence holds it. */
static void ring_let_go(struct tsr_kv_cache *c, int32_t i, int s) {
  struct tsr_kv__pool *q = &c->pools[TSR_KV_POOL_SLIDING];
  if (q->pos[i] > c->released[s]) c->released[s] = q->pos[i];
  q->seqs[i] &= ~(1ull << s);
  if (!q->seqs[i]) cell_free(q, i);
}

/* A dead cell's age for ring_pick: empty cells first, then by position. */
static int64_t ring_age(const struct tsr_kv__pool *q, int32_t cell) {
  return q->pos[cell] < 0 ? -1 : q->pos[cell];
}

/* Dead cells of age at most a. */
static int32_t ring_count_upto(const struct tsr_kv__pool *q, uint64_t in_batch,
                               const int64_t *p_min, int64_t a) {
  int32_t k = 0;
  for (int32_t i = 0; i < q->n_cells; i++)
    k += ring_dead(q, i, in_batch, p_min) && ring_age(q, i) <= a;
  return k;
}

/* The ring's n cells for this step (at least n are dead: the caller counted), into
** ring->slots in cell order. A sequence is owed window + n_ubatch cells (the ring
** has that many per sequence): it lets go of its cells past that, counted back from
** its largest position in the batch (p_max; a shared cell stays with its other
** sequences); of the dead cells only the n oldest go (empty cells, then the
** smallest positions). So a sequence keeps its last window + n_ubatch positions,
** never more: a tail of up to n_ubatch tokens can
** be removed and resumed (speculative rollback, the server's prompt reuse, bench's
** repetitions at depth), and no sequence crowds out another. Which cells a step
** reuses changes no result: attention masks the window by position. */
static void ring_pick(struct tsr_kv_cache *c, uint64_t in_batch, const int64_t *p_min,
                      const int64_t *p_max, int32_t n) {
  struct tsr_kv__pool *q = &c->pools[TSR_KV_POOL_SLIDING];
  const int64_t owed = (int64_t)q->window + c->params.n_ubatch;
  /* past its share a sequence of the batch lets go of a cell, shared or not (it is out
  ** of that sequence's window): so every sequence holds at most its share, and the
  ** ring, n_seq shares, cannot fill with cells a copied prefix keeps */
  int64_t lo = INT64_MAX, hi = -1; /* the ages of the dead cells, after that */
  for (int32_t i = 0; i < q->n_cells; i++) {
    for (uint64_t m = q->pos[i] >= 0 ? q->seqs[i] & in_batch : 0; m; m &= m - 1)
      if (q->pos[i] <= p_max[__builtin_ctzll(m)] - owed) ring_let_go(c, i, __builtin_ctzll(m));
    if (!ring_dead(q, i, in_batch, p_min)) continue;
    const int64_t a = ring_age(q, i);
    lo = a < lo ? a : lo, hi = a > hi ? a : hi;
  }
  if (n <= 0) return;
  /* the smallest age t with n dead cells at or below it (lo for a single token) */
  while (n > 1 && lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (ring_count_upto(q, in_batch, p_min, mid) >= n) hi = mid;
    else lo = mid + 1;
  }
  const int64_t t = lo;
  int32_t at_t = n - (n > 1 ? ring_count_upto(q, in_batch, p_min, t - 1) : 0), k = 0;
  for (int32_t i = 0; i < q->n_cells && k < n; i++) {
    if (!ring_dead(q, i, in_batch, p_min)) continue;
    const int64_t a = ring_age(q, i);
    if (a > t || (a == t && at_t-- <= 0)) continue;
    for (uint64_t m = a >= 0 ? q->seqs[i] : 0; m; m &= m - 1)
      ring_let_go(c, i, __builtin_ctzll(m));
    q->slots[k++] = i;
  }
}

tsr_status tsr_kv_cache_prepare(struct tsr_kv_cache *c, const int32_t *pos, const int32_t *seq,
                                int32_t n, struct tsr_kv_slots *out) {
  memset(out, 0, sizeof *out);
  if (n < 0 || n > c->params.n_ubatch)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "kv cache: %d tokens in a step of at most "
                         "n_ubatch %d", n, c->params.n_ubatch);
  uint64_t in_batch = 0;
  int64_t p_min[TSR_KV_MAX_SEQ], p_max[TSR_KV_MAX_SEQ];
  for (int s = 0; s < TSR_KV_MAX_SEQ; s++) p_min[s] = INT64_MAX, p_max[s] = -1;
  for (int32_t i = 0; i < n; i++) {
    if (seq[i] < 0 || seq[i] >= c->params.n_seq || pos[i] < 0)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "kv cache: token %d has sequence %d (of %d) and "
                           "position %d", i, seq[i], c->params.n_seq, pos[i]);
    in_batch |= 1ull << seq[i];
    if (pos[i] < p_min[seq[i]]) p_min[seq[i]] = pos[i];
    if (pos[i] > p_max[seq[i]]) p_max[seq[i]] = pos[i];
  }
  /* count first, so a step that does not fit changes nothing */
  struct tsr_kv__pool *full = &c->pools[TSR_KV_POOL_FULL], *ring = &c->pools[TSR_KV_POOL_SLIDING];
  const int32_t n_free = full->n_cells - full->n_used;
  if (n_free < n)
    return tsr_error_set(TSR_ERR_NOMEM, "context full: %d tokens need cells but %d of n_ctx %d "
                         "are free", n, n_free, full->n_cells);
  if (ring->n_cells) {
    int32_t n_dead = 0;
    for (int32_t i = 0; i < ring->n_cells; i++) n_dead += ring_dead(ring, i, in_batch, p_min);
    if (n_dead < n)
      return tsr_error_set(TSR_ERR_NOMEM, "context full: %d tokens need cells of the sliding "
                           "ring but %d of its %d (n_seq %d x (window %d + n_ubatch %d), at most "
                           "n_ctx %d) are free", n, n_dead, ring->n_cells, c->params.n_seq,
                           ring->window, c->params.n_ubatch, c->params.n_ctx);
    ring_pick(c, in_batch, p_min, p_max, n);
    for (int32_t t = 0; t < n; t++) {
      ring->pos[ring->slots[t]] = pos[t];
      ring->seqs[ring->slots[t]] = 1ull << seq[t];
      if (ring->slots[t] >= ring->hi) ring->hi = ring->slots[t] + 1;
    }
    ring->n_used += n;
  }
  /* the first free cells in order, as a scan from cell 0 would find them */
  int32_t i = full->free_hint;
  for (int32_t t = 0; i < full->n_cells && t < n; i++) {
    if (full->pos[i] >= 0) continue;
    full->pos[i] = pos[t];
    full->seqs[i] = 1ull << seq[t];
    full->slots[t] = i;
    if (pos[t] > c->seq_max[seq[t]]) c->seq_max[seq[t]] = pos[t]; /* read only while valid */
    t++;
  }
  full->n_used += n;
  full->free_hint = i;
  if (i > full->hi) full->hi = i; /* i: one past the last cell taken */
  out->n = n;
  for (int pl = 0; pl < TSR_KV_POOL_COUNT; pl++)
    if (pool_used(c, pl)) out->cells[pl] = c->pools[pl].slots;
  return TSR_OK;
}

void tsr_kv_cache_fill_kv_pos(const struct tsr_kv_cache *c, enum tsr_kv_pool pool, int32_t seq,
                              int32_t n_cells, int32_t *kv_pos) {
  const struct tsr_kv__pool *q = &c->pools[pool];
  const uint64_t bit = seq >= 0 && seq < TSR_KV_MAX_SEQ ? 1ull << seq : 0;
  for (int32_t i = 0; i < n_cells && i < q->n_cells; i++)
    kv_pos[i] = seq < 0 || (q->seqs[i] & bit) ? q->pos[i] : -1;
}

void tsr_kv_cache_fill_mask(const struct tsr_kv_cache *c, enum tsr_kv_pool pool,
                            const int32_t *q_pos, const int32_t *q_seq, int n, bool causal,
                            int32_t window, int32_t n_cells, float *mask) {
  const struct tsr_kv__pool *q = &c->pools[pool];
  if (n_cells > q->n_cells) n_cells = q->n_cells;
  for (int j = 0; j < n; j++) {
    float *row = mask + (size_t)j * (size_t)n_cells;
    uint64_t bit = q_seq[j] >= 0 && q_seq[j] < TSR_KV_MAX_SEQ ? 1ull << q_seq[j] : 0;
    for (int32_t i = 0; i < n_cells; i++) {
      int32_t p = q->pos[i];
      bool see = p >= 0 && (q->seqs[i] & bit) && (!causal || p <= q_pos[j]) &&
                 (window <= 0 || (int64_t)q_pos[j] - p < window);
      row[i] = see ? 0.0f : -INFINITY;
    }
  }
}

/* ---- sequences ------------------------------------------------------------- */

static bool in_range(int32_t p, int32_t p0, int32_t p1) {
  return p >= 0 && p >= p0 && (p1 < 0 || p < p1);
}

/* Whether [p0, p1) covers some but not all of seq's positions. */
static bool covers_part(const struct tsr_kv_cache *c, int32_t seq, int32_t p0, int32_t p1) {
  const struct tsr_kv__pool *q = &c->pools[TSR_KV_POOL_FULL];
  bool in = false, out = false;
  for (int32_t i = 0; i < q->n_cells; i++) {
    if (q->pos[i] < 0 || !(q->seqs[i] >> seq & 1)) continue;
    if (in_range(q->pos[i], p0, p1)) in = true;
    else out = true;
  }
  return in && out;
}

static void state_zero(struct tsr_kv_cache *c, int32_t seq) {
  for (int32_t i = 0; i < c->n_layers; i++) {
    float *s = tsr_kv_cache_state(c, i, seq);
    if (s) memset(s, 0, (size_t)c->layers[i].desc.state_bytes);
  }
}

/* state_restored: the caller set the linear layers' state to what it was before
** p0 (a checkpoint), so a partial removal is exact for them too */
static tsr_status seq_rm(struct tsr_kv_cache *c, int32_t seq, int32_t p0, int32_t p1,
                         bool state_restored) {
  if (seq >= c->params.n_seq)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "kv cache: sequence %d of %d", seq,
                         c->params.n_seq);
  uint64_t which = seq < 0 ? ~0ull : 1ull << seq;
  /* keeping positions below p0 and resuming at p0 needs the ring's keys
  ** (p0 - window, p0): refuse when the ring has released them */
  const int32_t window = c->pools[TSR_KV_POOL_SLIDING].window;
  for (int32_t s = 0; s < c->params.n_seq && c->pools[TSR_KV_POOL_SLIDING].n_cells; s++)
    if ((which >> s & 1) && p0 > 0 && (p1 < 0 || p1 > tsr_kv_cache_seq_pos_max(c, s)) &&
        c->released[s] >= 0 && p0 - window < c->released[s])
      return tsr_error_set(TSR_ERR_UNSUPPORTED, "kv cache: sequence %d cannot resume at "
                           "position %d: the sliding ring (window %d) has released its keys up "
                           "to position %d; remove the whole sequence instead", s, p0, window,
                           c->released[s]);
  if (c->has_linear && !state_restored)
    for (int32_t s = 0; s < c->params.n_seq; s++)
      if ((which >> s & 1) && covers_part(c, s, p0, p1))
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "kv cache: removing positions [%d, %d) of "
                             "sequence %d would leave the linear layers' state holding them "
                             "(recurrent state cannot roll back)", p0, p1, s);
  for (int pl = 0; pl < TSR_KV_POOL_COUNT; pl++) {
    struct tsr_kv__pool *q = &c->pools[pl];
    for (int32_t i = 0; i < q->n_cells; i++) {
      if (!in_range(q->pos[i], p0, p1)) continue;
      q->seqs[i] &= ~which;
      if (!q->seqs[i]) cell_free(q, i);
    }
  }
  c->seq_max_valid = false;
  /* a partial removal reached here with state only restored: a touched state whose
  ** sequence is gone is zeroed */
  for (int32_t s = 0; s < c->params.n_seq; s++)
    if ((which >> s & 1) && tsr_kv_cache_seq_pos_max(c, s) < 0) {
      state_zero(c, s);
      c->released[s] = -1; /* an empty sequence starts over */
    }
  return TSR_OK;
}

tsr_status tsr_kv_cache_seq_rm(struct tsr_kv_cache *c, int32_t seq, int32_t p0, int32_t p1) {
  return seq_rm(c, seq, p0, p1, false);
}

float *tsr_kv_cache_checkpoints(const struct tsr_kv_cache *c, int32_t layer) {
  return layer >= 0 && layer < c->n_layers ? c->layers[layer].ckpt : NULL;
}

int32_t tsr_kv_cache_n_checkpoints(const struct tsr_kv_cache *c) {
  return c->has_linear ? c->params.n_checkpoints : 0;
}

tsr_status tsr_kv_cache_seq_rm_restored(struct tsr_kv_cache *c, int32_t seq, int32_t p0) {
  if (seq < 0 || seq >= c->params.n_seq || p0 < 1)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "kv cache: rollback of sequence %d (of %d) to "
                         "position %d", seq, c->params.n_seq, p0);
  return seq_rm(c, seq, p0, -1, true);
}

tsr_status tsr_kv_cache_seq_cp(struct tsr_kv_cache *c, int32_t src, int32_t dst, int32_t p0,
                               int32_t p1) {
  if (src < 0 || src >= c->params.n_seq || dst < 0 || dst >= c->params.n_seq)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "kv cache: copy of sequence %d to %d (of %d)", src,
                         dst, c->params.n_seq);
  if (src == dst) return TSR_OK;
  if (c->has_linear && covers_part(c, src, p0, p1))
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "kv cache: copying positions [%d, %d) of sequence "
                         "%d: the linear layers' state holds all of it and cannot be split",
                         p0, p1, src);
  /* dst must not hold those positions already: attention would count them twice */
  for (int pl = 0; pl < TSR_KV_POOL_COUNT; pl++) {
    const struct tsr_kv__pool *q = &c->pools[pl];
    for (int32_t i = 0; i < q->n_cells; i++)
      if ((q->seqs[i] >> dst & 1) && !(q->seqs[i] >> src & 1) && in_range(q->pos[i], p0, p1))
        return tsr_error_set(TSR_ERR_INVALID_ARG, "kv cache: copying sequence %d to %d: %d "
                             "already holds position %d", src, dst, dst, q->pos[i]);
  }
  for (int pl = 0; pl < TSR_KV_POOL_COUNT; pl++) {
    struct tsr_kv__pool *q = &c->pools[pl];
    for (int32_t i = 0; i < q->n_cells; i++)
      if ((q->seqs[i] >> src & 1) && in_range(q->pos[i], p0, p1)) q->seqs[i] |= 1ull << dst;
  }
  c->seq_max_valid = false;
  /* the state belongs to src's positions: it travels only with all of them */
  for (int32_t i = 0; i < c->n_layers && tsr_kv_cache_seq_pos_max(c, src) >= 0; i++) {
    float *from = tsr_kv_cache_state(c, i, src), *to = tsr_kv_cache_state(c, i, dst);
    if (from && to) memcpy(to, from, (size_t)c->layers[i].desc.state_bytes);
  }
  /* dst now needs what src's ring released */
  if (c->released[src] > c->released[dst]) c->released[dst] = c->released[src];
  return TSR_OK;
}

tsr_status tsr_kv_cache_seq_add(struct tsr_kv_cache *c, int32_t seq, int32_t p0, int32_t p1,
                                int32_t delta) {
  if (seq < 0 || seq >= c->params.n_seq)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "kv cache: sequence %d of %d", seq,
                         c->params.n_seq);
  if (delta == 0) return TSR_OK;
  const uint64_t bit = 1ull << seq;
  /* check everything first, so a refusal changes nothing */
  for (int pl = 0; pl < TSR_KV_POOL_COUNT; pl++) {
    const struct tsr_kv__pool *q = &c->pools[pl];
    int64_t lo = INT64_MAX, hi = INT64_MIN; /* where the moved positions land */
    for (int32_t i = 0; i < q->n_cells; i++) {
      if (!(q->seqs[i] & bit) || !in_range(q->pos[i], p0, p1)) continue;
      int64_t to = (int64_t)q->pos[i] + delta;
      if (q->seqs[i] != bit)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "kv cache: moving position %d of sequence %d: "
                             "its cell is shared with another sequence", q->pos[i], seq);
      if (to < 0 || to > INT32_MAX)
        return tsr_error_set(TSR_ERR_INVALID_ARG, "kv cache: moving position %d of sequence %d "
                             "by %d leaves the positions", q->pos[i], seq, delta);
      if (to < lo) lo = to;
      if (to > hi) hi = to;
    }
    /* the moved span must land where seq holds nothing else: positions stay unique */
    for (int32_t i = 0; i < q->n_cells; i++)
      if ((q->seqs[i] & bit) && !in_range(q->pos[i], p0, p1) && q->pos[i] >= lo &&
          q->pos[i] <= hi)
        return tsr_error_set(TSR_ERR_INVALID_ARG, "kv cache: moving positions [%d, %d) of "
                             "sequence %d by %d lands on position %d, which it holds", p0, p1,
                             seq, delta, q->pos[i]);
  }
  for (int pl = 0; pl < TSR_KV_POOL_COUNT; pl++) {
    struct tsr_kv__pool *q = &c->pools[pl];
    for (int32_t i = 0; i < q->n_cells; i++)
      if ((q->seqs[i] & bit) && in_range(q->pos[i], p0, p1)) q->pos[i] += delta;
  }
  /* what the ring released moves with the positions it stood for */
  if (c->released[seq] >= 0 && in_range(c->released[seq], p0, p1)) {
    const int64_t r = (int64_t)c->released[seq] + delta;
    c->released[seq] = r < 0 ? -1 : (int32_t)r;
  }
  c->seq_max_valid = false;
  return TSR_OK;
}

void tsr_kv_cache_seq_keep(struct tsr_kv_cache *c, int32_t seq) {
  uint64_t keep = seq >= 0 && seq < c->params.n_seq ? 1ull << seq : 0;
  for (int pl = 0; pl < TSR_KV_POOL_COUNT; pl++) {
    struct tsr_kv__pool *q = &c->pools[pl];
    for (int32_t i = 0; i < q->n_cells; i++) {
      q->seqs[i] &= keep;
      if (!q->seqs[i]) cell_free(q, i);
    }
    c->seq_max_valid = false;
  }
  for (int32_t s = 0; s < c->params.n_seq; s++)
    if (s != seq) state_zero(c, s), c->released[s] = -1; /* emptied: they start over */
}

/* Every sequence's largest position, recounted when a change other than prepare dropped
** them (one pass over the full pool). */
static const int32_t *seq_maxima(const struct tsr_kv_cache *cc) {
  struct tsr_kv_cache *c = (struct tsr_kv_cache *)cc; /* a cache of what the cells say */
  if (c->seq_max_valid) return c->seq_max;
  const struct tsr_kv__pool *q = &c->pools[TSR_KV_POOL_FULL];
  for (int32_t s = 0; s < TSR_KV_MAX_SEQ; s++) c->seq_max[s] = -1;
  for (int32_t i = 0; i < q->n_cells; i++)
    for (uint64_t m = q->seqs[i]; m; m &= m - 1) {
      const int s = __builtin_ctzll(m);
      if (q->pos[i] > c->seq_max[s]) c->seq_max[s] = q->pos[i];
    }
  c->seq_max_valid = true;
  return c->seq_max;
}

int32_t tsr_kv_cache_seq_pos_max(const struct tsr_kv_cache *c, int32_t seq) {
  if (seq < 0 || seq >= c->params.n_seq) return -1;
  return seq_maxima(c)[seq];
}

void tsr_kv_cache_seq_pos_max_all(const struct tsr_kv_cache *c, int32_t *out) {
  const int32_t *m = seq_maxima(c);
  for (int32_t s = 0; s < c->params.n_seq; s++) out[s] = m[s];
}

int32_t tsr_kv_cache_n_free(const struct tsr_kv_cache *c, enum tsr_kv_pool pool) {
  const struct tsr_kv__pool *q = &c->pools[pool];
  return q->n_cells - q->n_used;
}

void tsr_kv_cache_clear(struct tsr_kv_cache *c) {
  for (int pl = 0; pl < TSR_KV_POOL_COUNT; pl++) {
    struct tsr_kv__pool *q = &c->pools[pl];
    for (int32_t i = 0; i < q->n_cells; i++) q->pos[i] = -1, q->seqs[i] = 0;
    q->n_used = 0, q->free_hint = 0, q->hi = 0;
    c->seq_max_valid = false;
  }
  for (int32_t s = 0; s < c->params.n_seq; s++) state_zero(c, s), c->released[s] = -1;
}

int32_t tsr_kv_cache_seq_resume_min(const struct tsr_kv_cache *c, int32_t seq) {
  if (seq < 0 || seq >= c->params.n_seq || c->released[seq] < 0) return 0;
  return c->released[seq] + c->pools[TSR_KV_POOL_SLIDING].window;
}

float *tsr_kv_cache_state(struct tsr_kv_cache *c, int32_t layer, int32_t seq) {
  if (layer < 0 || layer >= c->n_layers || seq < 0 || seq >= c->params.n_seq) return NULL;
  struct tsr_kv__layer *y = &c->layers[layer];
  if (!y->state) return NULL;
  return y->state + (size_t)seq * (size_t)(y->desc.state_bytes / 4);
}

tsr_status tsr_kv_cache_each_buffer(const struct tsr_kv_cache *c,
                                    tsr_status (*fn)(void *ctx, void *p, size_t bytes), void *ctx) {
  for (int32_t i = 0; i < c->n_layers; i++) {
    const struct tsr_kv__layer *y = &c->layers[i];
    void *bufs[4 + 2 * TSR_KV_CODEC_MAX_STATE] = {y->k, y->v, y->state, y->ckpt};
    uint64_t sizes[4 + 2 * TSR_KV_CODEC_MAX_STATE] = {y->k_bytes, y->v_bytes, y->state_bytes,
                                                      y->ckpt_bytes};
    int n = 4;
    for (int side = 0; side < 2; side++)
      for (int32_t j = 0; j < y->codec_n_state[side]; j++, n++)
        bufs[n] = y->codec_state[side][j], sizes[n] = y->codec_state_bytes[side][j];
    for (int b = 0; b < n; b++) {
      if (!bufs[b] || !sizes[b]) continue;
      tsr_status st = fn(ctx, bufs[b], (size_t)sizes[b]);
      if (st != TSR_OK) return st;
    }
  }
  return TSR_OK;
}
