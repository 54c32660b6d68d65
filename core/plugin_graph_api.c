/* The graph-builder half of the services table: thin adapters from the
** plugin ABI's plain types to the core's builders. */
#include "error.h"
#include "gguf.h"
#include "graph.h"
#include "kv_cache.h"
#include "plugin_graph_api.h"

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
  if (fw->layers[layer].kv_shared_from)
    tsr_kv_cache_layer_views(fw->g, fw->kv, layer, &call->k, &call->v);
  else
    tsr_kv_cache_store(fw->g, fw->kv, layer, k, v, fw->kv_cells[pool], &call->k, &call->v);
  call->kv_pos = fw->kv_pos[pool];
  call->mask = fw->seq < 0 ? fw->kv_mask[pool] : NULL;
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
