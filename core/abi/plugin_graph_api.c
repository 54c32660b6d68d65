/* The graph-builder half of the services table: thin adapters from the
** plugin ABI's plain types to the core's builders. */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "model/gguf.h"
#include "graph/graph.h"
#include "kv/kv_cache.h"
#include "abi/plugin_graph_api.h"
#include "abi/plugin_host.h"

struct tsr_tensor *tsr_api_weight(struct tsr_graph *g, const struct tsr_gguf *model,
                                  const char *name) {
  const struct tsr_gguf_tensor *w = tsr_gguf_find_tensor(model, name);
  if (!w) {
    tsr_error_set(TSR_ERR_FORMAT, "%s: tensor '%s' is missing", tsr_gguf_path(model), name);
    /* record it in the graph so chained builders stop with this message */
    tsr_graph_fail(g, TSR_ERR_FORMAT, tsr_error_message());
    return NULL;
  }
  struct tsr_tensor *t =
      tsr_new_external(g, w->dtype, (int)w->n_dims, w->ne, (void *)(uintptr_t)w->data);
  tsr_tensor_set_name(t, "%s", name);
  return t;
}

int tsr_api_has_weight(const struct tsr_gguf *model, const char *name) {
  return tsr_gguf_find_tensor(model, name) != NULL;
}

struct tsr_tensor *tsr_api_new_tensor(struct tsr_graph *g, int32_t dtype, int32_t n_dims,
                                      const int64_t *ne) {
  return tsr_new_tensor(g, (enum tsr_dtype)dtype, n_dims, ne);
}

void tsr_api_set_name(struct tsr_tensor *t, const char *name) { tsr_tensor_set_name(t, "%s", name); }

struct tsr_tensor *tsr_api_rope(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *pos,
                                struct tsr_tensor *ff, int32_t n_rot, int32_t neox, float freq_base,
                                float freq_scale) {
  struct tsr_rope_params p = {.n_rot = n_rot, .mode = neox ? TSR_ROPE_NEOX : TSR_ROPE_NORMAL,
                              .freq_base = freq_base, .freq_scale = freq_scale};
  return tsr_rope(g, a, pos, ff, &p);
}

struct tsr_tensor *tsr_api_unary(struct tsr_graph *g, struct tsr_tensor *a, int32_t op) {
  return tsr_unary(g, a, (enum tsr_unary_op)op);
}

struct tsr_tensor *tsr_api_glu(struct tsr_graph *g, struct tsr_tensor *gate, struct tsr_tensor *up,
                               int32_t op, bool swapped) {
  return tsr_glu(g, gate, up, (enum tsr_glu_op)op, swapped);
}

struct tsr_tensor *tsr_api_concat(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *b,
                                  int32_t dim) {
  return tsr_concat(g, a, b, dim);
}

struct tsr_tensor *tsr_api_reshape(struct tsr_graph *g, struct tsr_tensor *a, int32_t n_dims,
                                   const int64_t *ne) {
  return tsr_reshape(g, a, n_dims, ne);
}

struct tsr_tensor *tsr_api_view(struct tsr_graph *g, struct tsr_tensor *a, int32_t n_dims,
                                const int64_t *ne, const size_t *nb, size_t offset) {
  return tsr_view(g, a, n_dims, ne, nb, offset);
}

struct tsr_tensor *tsr_api_permute(struct tsr_graph *g, struct tsr_tensor *a, int32_t ax0,
                                   int32_t ax1, int32_t ax2, int32_t ax3) {
  return tsr_permute(g, a, ax0, ax1, ax2, ax3);
}

struct tsr_tensor *tsr_api_top_k(struct tsr_graph *g, struct tsr_tensor *a, int32_t k) {
  return tsr_top_k(g, a, k);
}

/* ---- KV codec hooks around attention (struct tsr_kv_codec_v1) ---- */

/* The cache a layer's K/V live in and the layer they belong to there: fw's own, or for a
** drafter's layer (kv_shared_from -1) the target's, at the target layer it reads; a NULL
** cache where there is none. */
struct kv_home {
  const struct tsr_kv_cache *kv;
  int32_t layer;
};

static struct kv_home kv_home(const struct tsr_arch_forward *fw, int32_t layer) {
  if (layer < 0 || layer >= fw->n_layers) return (struct kv_home){NULL, -1};
  if (fw->layers[layer].kv_shared_from < 0)
    return (struct kv_home){fw->target_kv,
                            fw->target_layer[fw->layers[layer].kind == TSR_LAYER_SLIDING]};
  return (struct kv_home){fw->kv, layer};
}

/* The codecs of a layer's K/V (kv_home), else NULL. */
static void layer_codecs(const struct tsr_arch_forward *fw, int32_t layer,
                         const struct tsr_kv_codec_v1 **k, const struct tsr_kv_codec_v1 **v) {
  *k = *v = NULL;
  const struct kv_home home = kv_home(fw, layer);
  if (home.kv) tsr_kv_cache_layer_codecs(home.kv, home.layer, k, v);
}

/* A hook's input: contiguous, as the hooks are promised. */
static struct tsr_tensor *hook_input(struct tsr_graph *g, struct tsr_tensor *x) {
  return !x || tsr_tensor_is_contiguous(x) ? x : tsr_cont(g, x);
}

/* Checks a hook's result: f32 [want_dim, ne1, ne2] of x's other dims. */
static struct tsr_tensor *hook_result(struct tsr_graph *g, const struct tsr_kv_codec_v1 *c,
                                      const char *hook, const struct tsr_tensor *x,
                                      struct tsr_tensor *y, int64_t want_dim) {
  if (!y) {
    if (tsr_graph_status(g) == TSR_OK) {
      char msg[160];
      snprintf(msg, sizeof msg, "kv codec %s: %s returned nothing", c->name, hook);
      tsr_graph_fail(g, TSR_ERR_INTERNAL, msg);
    }
    return NULL;
  }
  if (y->dtype != TSR_F32 || y->ne[0] != want_dim || y->ne[1] != x->ne[1] ||
      y->ne[2] != x->ne[2] || y->ne[3] != x->ne[3]) {
    char msg[256];
    snprintf(msg, sizeof msg, "kv codec %s: %s made [%lld, %lld, %lld] of dtype %d from [%lld, "
             "%lld, %lld]; wanted f32 with head dim %lld", c->name, hook, (long long)y->ne[0],
             (long long)y->ne[1], (long long)y->ne[2], (int)y->dtype, (long long)x->ne[0],
             (long long)x->ne[1], (long long)x->ne[2], (long long)want_dim);
    tsr_graph_fail(g, TSR_ERR_INVALID_ARG, msg);
    return NULL;
  }
  return y;
}

typedef struct tsr_tensor *(*codec_hook_fn)(void *, const struct tsr_host *, struct tsr_graph *,
                                            const struct tsr_kv_codec_site *, struct tsr_tensor *);

/* A codec and where its hooks run: the layer, the side and its state there. */
struct codec_at {
  const struct tsr_kv_codec_v1 *codec;
  struct tsr_kv_codec_site site;
};

static void codec_at(const struct tsr_arch_forward *fw, int32_t layer, bool is_k,
                     const struct tsr_kv_codec_v1 *codec, struct codec_at *at) {
  const struct kv_home home = kv_home(fw, layer);
  at->codec = codec;
  at->site = (struct tsr_kv_codec_site){
      .struct_size = sizeof at->site, .layer = home.layer, .is_k = is_k,
      .head_dim = is_k ? fw->layers[layer].head_dim_k : fw->layers[layer].head_dim_v};
  if (codec && codec->n_state > 0 && home.kv) /* layer_codecs gives codecs with a cache only */
    tsr_kv_cache_codec_state(fw->g, home.kv, home.layer, is_k, at->site.state);
}

/* x through one of the codec's storage-dim hooks (prepare_rows, prepare_q), or x
** itself when the codec has none */
static struct tsr_tensor *codec_apply(struct tsr_graph *g, const struct codec_at *at,
                                      codec_hook_fn hook, const char *name,
                                      struct tsr_tensor *x) {
  if (!hook || !x) return x;
  x = hook_input(g, x);
  const struct tsr_kv_codec_v1 *c = at->codec;
  const int32_t dim = tsr_kv_codec_storage_dim(c, (int32_t)x->ne[0]);
  return x ? hook_result(g, c, name, x,
                         hook(c->ctx, tsr_plugin_host_services(), g, &at->site, x), dim)
           : NULL;
}

/* rows as the codec stores them */
static struct tsr_tensor *codec_rows(struct tsr_graph *g, const struct codec_at *at,
                                     struct tsr_tensor *x) {
  return codec_apply(g, at, at->codec ? at->codec->prepare_rows : NULL, "prepare_rows", x);
}

/* queries as keys stored in the codec are scored against */
static struct tsr_tensor *codec_q(struct tsr_graph *g, const struct codec_at *at,
                                  struct tsr_tensor *q) {
  return codec_apply(g, at, at->codec ? at->codec->prepare_q : NULL, "prepare_q", q);
}

/* tsr_attn_call.prepare_q as the host hands it to an attention that positions q itself */
static struct tsr_tensor *call_prepare_q(const struct tsr_attn_call *call, struct tsr_graph *g,
                                         struct tsr_tensor *q) {
  return codec_q(g, call->prepare_q_ctx, q);
}

tsr_status tsr_api_kv_attend(struct tsr_arch_forward *fw, int32_t layer, struct tsr_tensor *k,
                             struct tsr_tensor *v, struct tsr_attn_call *call) {
  if (!call)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "kv_attend: no attention call to fill");
  call->k = call->v = call->kv_pos = call->mask = NULL;
  if (!fw->kv || layer < 0 || layer >= fw->n_layers)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "kv_attend: no KV cache, or layer %d outside "
                         "0..%d", layer, fw->n_layers - 1);
  int pool = tsr_kv_cache_layer_pool(fw->kv, layer);
  if (pool < 0 || !fw->kv_cells[pool] || !fw->kv_pos[pool])
    return tsr_error_set(TSR_ERR_INVALID_ARG, "kv_attend: layer %d has no K/V in the cache",
                         layer);
  if (fw->seq < 0 && !fw->kv_mask[pool])
    return tsr_error_set(TSR_ERR_INVALID_ARG, "kv_attend: a batch of several sequences "
                         "without their mask");
  if (fw->layers[layer].kv_shared_from) {
    tsr_kv_cache_layer_views(fw->g, fw->kv, layer, &call->k, &call->v);
  } else {
    const struct tsr_kv_codec_v1 *kc, *vc;
    layer_codecs(fw, layer, &kc, &vc);
    struct codec_at k_at, v_at;
    codec_at(fw, layer, true, kc, &k_at);
    codec_at(fw, layer, false, vc, &v_at);
    k = codec_rows(fw->g, &k_at, k);
    v = codec_rows(fw->g, &v_at, v);
    if (k && v)
      tsr_kv_cache_store(fw->g, fw->kv, layer, k, v, fw->kv_cells[pool], &call->k, &call->v);
  }
  call->kv_pos = fw->kv_pos[pool];
  call->mask = fw->seq < 0 ? fw->kv_mask[pool] : NULL;
  /* the cells past the span are empty: attention reads the span's only */
  const int64_t span = fw->kv_pos[pool]->ne[0];
  if (call->k && call->v && call->k->ne[1] > span) {
    call->k = tsr_view(fw->g, call->k, 3, (int64_t[]){call->k->ne[0], span, call->k->ne[2]},
                       call->k->nb, 0);
    call->v = tsr_view(fw->g, call->v, 3, (int64_t[]){call->v->ne[0], span, call->v->ne[2]},
                       call->v->nb, 0);
  }
  /* a codec the attention reads lifted: f16 rows of the span, by the codec's kernel */
  bool k_lift, v_lift;
  tsr_kv_cache_layer_lifts(fw->kv, layer, &k_lift, &v_lift);
  if (k_lift && call->k) call->k = tsr_cast(fw->g, call->k, TSR_F16);
  if (v_lift && call->v) call->v = tsr_cast(fw->g, call->v, TSR_F16);
  tsr_status st = tsr_graph_status(fw->g);
  return st != TSR_OK ? st : (call->k && call->v) ? TSR_OK : TSR_ERR_INTERNAL;
}

struct tsr_tensor *tsr_api_kv_state(struct tsr_arch_forward *fw, int32_t layer, int64_t n_floats) {
  float *state = fw->kv && layer >= 0 && layer < fw->n_layers
                     ? tsr_kv_cache_state(fw->kv, layer, fw->seq)
                     : NULL;
  if (!state || n_floats <= 0 || n_floats * 4 > fw->layers[layer].state_bytes) {
    tsr_graph_fail(fw->g, TSR_ERR_INVALID_ARG,
                   "kv_state: no recurrent state slot of that size for this layer");
    return NULL;
  }
  struct tsr_tensor *t = tsr_new_external(fw->g, TSR_F32, 1, &n_floats, state);
  tsr_tensor_set_name(t, "state.%d", layer);
  return t;
}

struct tsr_tensor *tsr_api_kv_checkpoints(struct tsr_arch_forward *fw, int32_t layer,
                                          int64_t n_floats) {
  if (fw->checkpoints <= 0) return NULL;
  float *rows = fw->kv && layer >= 0 && layer < fw->n_layers && fw->seq >= 0
                    ? tsr_kv_cache_checkpoints(fw->kv, layer)
                    : NULL;
  if (!rows || n_floats <= 0 || n_floats * 4 != fw->layers[layer].state_bytes ||
      fw->n_tokens > tsr_kv_cache_n_checkpoints(fw->kv)) {
    tsr_graph_fail(fw->g, TSR_ERR_INVALID_ARG,
                   "kv_checkpoints: no checkpoint rows of that size for this layer and batch");
    return NULL;
  }
  struct tsr_tensor *t =
      tsr_new_external(fw->g, TSR_F32, 2, (int64_t[]){n_floats, fw->n_tokens}, rows);
  tsr_tensor_set_name(t, "checkpoints.%d", layer);
  return t;
}

/* The pool of an owning attention layer's K, or -1 with the graph's error set. */
static int shift_pool(struct tsr_kv_shift *sh, int32_t layer) {
  int pool = sh->kv && layer >= 0 && layer < sh->n_layers && !sh->layers[layer].kv_shared_from
                 ? tsr_kv_cache_layer_pool(sh->kv, layer)
                 : -1;
  if (pool < 0 || sh->layers[layer].n_head_kv > sh->max_heads) {
    tsr_graph_fail(sh->g, TSR_ERR_INVALID_ARG,
                   "kv_shift: the layer owns no K in this cache (linear, or KV-shared)");
    return -1;
  }
  return pool;
}

tsr_status tsr_api_kv_shift_k(struct tsr_kv_shift *sh, int32_t layer, struct tsr_tensor **k,
                              struct tsr_tensor **delta_pos) {
  *k = *delta_pos = NULL;
  int pool = shift_pool(sh, layer);
  if (pool < 0) return tsr_graph_status(sh->g);
  const int64_t n = sh->n_cells[pool], heads = sh->layers[layer].n_head_kv;
  if (n == 0) return TSR_OK;
  const struct tsr_kv_codec_v1 *kc, *vc;
  tsr_kv_cache_layer_codecs(sh->kv, layer, &kc, &vc);
  if (kc && kc->prepare_rows) {
    char msg[200];
    snprintf(msg, sizeof msg, "kv_shift: layer %d's K codec %s stores keys transformed "
             "(prepare_rows), which RoPE cannot rotate in place: a context shift is refused",
             layer, kc->name);
    tsr_graph_fail(sh->g, TSR_ERR_UNSUPPORTED, msg);
    return TSR_ERR_UNSUPPORTED;
  }
  /* get_rows pairs one index column with each kv head: cells[] repeats the cells per head */
  struct tsr_tensor *idx = tsr_new_external(sh->g, TSR_I32, 2, (int64_t[]){n, heads},
                                            (void *)(uintptr_t)sh->cells[pool]);
  struct tsr_tensor *rows = tsr_get_rows(sh->g, tsr_kv_cache_k_buffer(sh->g, sh->kv, layer), idx);
  *k = rows ? tsr_permute(sh->g, rows, 0, 2, 1, 3) : NULL; /* [D, n, H] -> [D, H, n] */
  *delta_pos = tsr_new_external(sh->g, TSR_I32, 1, &(int64_t){n},
                                (void *)(uintptr_t)sh->delta_pos[pool]);
  tsr_status st = tsr_graph_status(sh->g);
  return st != TSR_OK ? st : *k ? TSR_OK : TSR_ERR_INTERNAL;
}

tsr_status tsr_api_kv_shift_store(struct tsr_kv_shift *sh, int32_t layer, struct tsr_tensor *k) {
  int pool = shift_pool(sh, layer);
  if (pool < 0) return tsr_graph_status(sh->g);
  const int64_t n = sh->n_cells[pool];
  if (!k || k->ne[2] != n) {
    tsr_graph_fail(sh->g, TSR_ERR_INVALID_ARG, "kv_shift_store: keys of another count of cells");
    return tsr_graph_status(sh->g);
  }
  struct tsr_tensor *idx = tsr_new_external(sh->g, TSR_I32, 1, &(int64_t){n},
                                            (void *)(uintptr_t)sh->cells[pool]);
  struct tsr_tensor *rows = tsr_permute(sh->g, k, 0, 2, 1, 3); /* [D, H, n] -> [D, n, H] */
  struct tsr_tensor *w = tsr_set_rows(sh->g, tsr_kv_cache_k_buffer(sh->g, sh->kv, layer), rows, idx);
  if (w) tsr_graph_mark_output(w); /* nothing reads it; it must still run */
  return tsr_graph_status(sh->g);
}

/* ---- attention that positions keys itself (struct tsr_attn_rope) ---------- */

/* The implementation layer's kind negotiated: the forward's per-kind entry
** when its caller filled one, else the one attention. */
static const struct tsr_attention_v1 *layer_attention(const struct tsr_arch_forward *fw,
                                                      int32_t layer) {
  if (layer >= 0 && layer < fw->n_layers) {
    const enum tsr_layer_kind k = fw->layers[layer].kind;
    if (k >= 0 && k < TSR_LAYER_KIND_COUNT && fw->attention_kind[k]) return fw->attention_kind[k];
  }
  return fw->attention;
}

static bool attention_rotates(const struct tsr_attention_v1 *a) { return a && a->rotates; }

struct tsr_tensor *tsr_api_rope_apply(struct tsr_graph *g, const struct tsr_attn_rope *rope,
                                      struct tsr_tensor *x, struct tsr_tensor *pos) {
  if (rope->rotate) return rope->rotate(rope, tsr_plugin_host_services(), g, x, pos);
  return tsr_api_rope(g, x, pos, rope->freq_factors, rope->n_rot, rope->neox, rope->freq_base,
                      rope->freq_scale);
}

/* Which caches hold keys that an attention placed itself, per layer kind.
** A shift whose host does not say which attention serves a kind (struct
** tsr_kv_shift.attention_kind left empty) must not rotate such keys as plain
** RoPE keys: it is refused instead. Every forward pass rewrites the entries
** of the kinds it stores, so a cache freed and reallocated at the same
** address never inherits another's. */
#define PLACED_CACHES 32
static struct {
  const struct tsr_kv_cache *kv;
  bool placed[TSR_LAYER_KIND_COUNT];
} g_placed[PLACED_CACHES];
static int g_placed_next;
static pthread_mutex_t g_placed_lock = PTHREAD_MUTEX_INITIALIZER;

static void placed_set(const struct tsr_kv_cache *kv, enum tsr_layer_kind kind, bool placed) {
  if (!kv || kind < 0 || kind >= TSR_LAYER_KIND_COUNT) return;
  pthread_mutex_lock(&g_placed_lock);
  int at = -1;
  for (int i = 0; i < PLACED_CACHES && at < 0; i++)
    if (g_placed[i].kv == kv) at = i;
  if (at < 0 && placed) {
    at = g_placed_next++ % PLACED_CACHES;
    g_placed[at].kv = kv;
    memset(g_placed[at].placed, 0, sizeof g_placed[at].placed);
  }
  if (at >= 0) g_placed[at].placed[kind] = placed;
  pthread_mutex_unlock(&g_placed_lock);
}

static bool placed_get(const struct tsr_kv_cache *kv, enum tsr_layer_kind kind) {
  bool placed = false;
  pthread_mutex_lock(&g_placed_lock);
  for (int i = 0; i < PLACED_CACHES; i++)
    if (g_placed[i].kv == kv) placed = g_placed[i].placed[kind];
  pthread_mutex_unlock(&g_placed_lock);
  return placed;
}

struct tsr_tensor *tsr_api_attn_rope(struct tsr_arch_forward *fw, int32_t layer,
                                     const struct tsr_attn_rope *rope, struct tsr_tensor *x,
                                     bool is_k) {
  if (!x || !rope) return x; /* a layer without RoPE */
  const struct tsr_attention_v1 *a = layer_attention(fw, layer);
  if (is_k && fw->kv && layer >= 0 && layer < fw->n_layers)
    placed_set(fw->kv, fw->layers[layer].kind, attention_rotates(a));
  if (!attention_rotates(a)) return tsr_api_rope_apply(fw->g, rope, x, fw->positions);
  if (!is_k) return x; /* the attention rotates q at the positions it chooses */
  if (!a->prepare_k) {
    char msg[160];
    snprintf(msg, sizeof msg, "attention %s rotates keys itself but cannot prepare them", a->name);
    tsr_graph_fail(fw->g, TSR_ERR_INVALID_ARG, msg);
    return NULL;
  }
  return a->prepare_k(a->ctx, tsr_plugin_host_services(), fw->g, rope, x, fw->positions);
}

struct tsr_tensor *tsr_api_attn_build(struct tsr_arch_forward *fw, int32_t layer,
                                      const struct tsr_attn_call *call) {
  const struct tsr_attention_v1 *a = layer_attention(fw, layer);
  if (!a) {
    tsr_graph_fail(fw->g, TSR_ERR_INVALID_ARG, "attn_build: the forward pass has no attention");
    return NULL;
  }
  /* a KV-shared layer reads keys its source's attention placed: both must agree on where */
  const int32_t src = layer >= 0 && layer < fw->n_layers ? fw->layers[layer].kv_shared_from - 1
                                                          : -1;
  if (src >= 0 && src < fw->n_layers) {
    const struct tsr_attention_v1 *b = layer_attention(fw, src);
    if (b != a && (attention_rotates(a) || attention_rotates(b))) {
      char msg[256];
      snprintf(msg, sizeof msg, "layer %d reads the keys of layer %d, which attention %s "
               "placed; it runs attention %s, which places keys differently", layer, src,
               b ? b->name : "?", a->name);
      tsr_graph_fail(fw->g, TSR_ERR_UNSUPPORTED, msg);
      return NULL;
    }
  }
  /* the layer's codecs' hooks: q transformed for the K codec (by the attention
  ** itself when it positions q), the output back from the V codec's storage */
  const struct tsr_kv_codec_v1 *kc, *vc;
  layer_codecs(fw, layer, &kc, &vc);
  struct tsr_attn_call hooked;
  /* the layer's decode parameters, on a decode step (one token of one sequence) */
  const struct tsr_decode_params *decode =
      fw->decode && layer >= 0 && layer < fw->n_layers && fw->n_tokens == 1 && fw->seq >= 0
          ? fw->decode[layer]
          : NULL;
  if (decode) {
    hooked = *call;
    hooked.decode = decode;
    call = &hooked;
  }
  struct codec_at k_at; /* lives through build: an attention that rotates calls back */
  if (kc && kc->prepare_q) {
    codec_at(fw, layer, true, kc, &k_at);
    if (call != &hooked) hooked = *call;
    if (attention_rotates(a)) {
      hooked.prepare_q = call_prepare_q;
      hooked.prepare_q_ctx = &k_at;
    } else if (!(hooked.q = codec_q(fw->g, &k_at, call->q))) {
      return NULL;
    }
    call = &hooked;
  }
  struct tsr_tensor *out = a->build(a->ctx, tsr_plugin_host_services(), fw->g, call);
  if (!out || !vc || !vc->finish_out) return out;
  struct codec_at v_at;
  codec_at(fw, layer, false, vc, &v_at);
  const int32_t dv = fw->layers[layer].head_dim_v;
  struct tsr_tensor *x = hook_input(fw->g, out);
  return x ? hook_result(fw->g, vc, "finish_out", x,
                         vc->finish_out(vc->ctx, tsr_plugin_host_services(), fw->g, &v_at.site, x),
                         dv)
           : NULL;
}

struct tsr_tensor *tsr_api_kv_shift_rope(struct tsr_kv_shift *sh, int32_t layer,
                                         const struct tsr_attn_rope *rope, struct tsr_tensor *k,
                                         struct tsr_tensor *delta_pos) {
  int pool = shift_pool(sh, layer);
  if (pool < 0 || !k || !rope) {
    if (pool >= 0) tsr_graph_fail(sh->g, TSR_ERR_INVALID_ARG, "kv_shift_rope: no keys or no RoPE");
    return NULL;
  }
  const enum tsr_layer_kind kind = sh->layers[layer].kind;
  const struct tsr_attention_v1 *a = sh->attention_kind[kind];
  if (!a && placed_get(sh->kv, kind)) {
    char msg[256];
    snprintf(msg, sizeof msg, "kv_shift: layer %d's keys were placed by an attention that "
             "positions keys itself, and this host's shift does not say which (struct "
             "tsr_kv_shift.attention_kind): refused rather than rotated as plain RoPE keys", layer);
    tsr_graph_fail(sh->g, TSR_ERR_UNSUPPORTED, msg);
    return NULL;
  }
  if (!attention_rotates(a)) return tsr_api_rope_apply(sh->g, rope, k, delta_pos);
  if (!a->shift_k) {
    char msg[160];
    snprintf(msg, sizeof msg, "attention %s places keys itself and cannot shift them", a->name);
    tsr_graph_fail(sh->g, TSR_ERR_UNSUPPORTED, msg);
    return NULL;
  }
  struct tsr_tensor *pos = NULL;
  if (sh->pos[pool])
    pos = tsr_new_external(sh->g, TSR_I32, 1, &(int64_t){sh->n_cells[pool]},
                           (void *)(uintptr_t)sh->pos[pool]);
  return a->shift_k(a->ctx, tsr_plugin_host_services(), sh->g, rope, k, pos, sh->delta);
}

struct tsr_tensor *tsr_api_custom_op_typed(struct tsr_graph *g, int32_t op_id, int32_t dtype,
                                           int32_t n_dims, const int64_t *ne,
                                           struct tsr_tensor *const *src, int32_t n_src,
                                           const int32_t *params, int32_t n_params) {
  /* i32 has f32's size, so the node's strides stand; other dtypes would need their own */
  if (dtype != TSR_F32 && dtype != TSR_I32) {
    char msg[96];
    snprintf(msg, sizeof msg, "custom op: output dtype %d (f32 or i32 only)", (int)dtype);
    tsr_graph_fail(g, TSR_ERR_INVALID_ARG, msg);
    return NULL;
  }
  struct tsr_tensor *t = tsr_custom_op(g, op_id, n_dims, ne, src, n_src, params, n_params);
  if (t) t->dtype = (enum tsr_dtype)dtype;
  return t;
}
