/*
** The KV cache in a graph: a layer's K and V buffers wrapped as external
** tensors, new rows written with set_rows, and the set_rows results handed
** on as the whole pool, so attention reads the cache after this step's
** writes in graph order.
*/
#include <stdio.h>

#include "graph/graph.h"
#include "kv/kv_cache_internal.h"

static void fail(struct tsr_graph *g, tsr_status st, const char *fmt, int32_t layer,
                 const char *what) {
  char msg[256];
  snprintf(msg, sizeof msg, fmt, layer, what);
  tsr_graph_fail(g, st, msg);
}

/* The graph dtype of a codec: a core type with the codec's exact block. */
static bool codec_dtype(const struct tsr_kv_codec_v1 *codec, enum tsr_dtype *dt) {
  const struct tsr_dtype_traits *tr = tsr_dtype_traits(codec->dtype);
  if (!tr || tr->block_size != codec->block_size || tr->type_size != codec->block_bytes)
    return false;
  *dt = (enum tsr_dtype)codec->dtype;
  return true;
}

/* One buffer of an owning layer as a [D, cells, Hkv] external tensor. */
static struct tsr_tensor *buffer(struct tsr_graph *g, const struct tsr_kv_cache *c,
                                 const struct tsr_kv__layer *y, int32_t layer, bool is_k) {
  const struct tsr_kv_codec_v1 *codec = is_k ? y->kc : y->vc;
  enum tsr_dtype dt;
  if (!codec_dtype(codec, &dt)) {
    fail(g, TSR_ERR_UNSUPPORTED, "kv cache: layer %d: codec %s is no graph type yet", layer,
         codec->name);
    return NULL;
  }
  int64_t ne[3] = {is_k ? y->desc.head_dim_k : y->desc.head_dim_v, c->pools[y->pool].n_cells,
                   y->desc.n_head_kv};
  struct tsr_tensor *t = tsr_new_external(g, dt, 3, ne, is_k ? y->k : y->v);
  tsr_tensor_set_name(t, "cache_%c_l%d", is_k ? 'k' : 'v', layer);
  return t;
}

static bool check_rows(struct tsr_graph *g, const struct tsr_kv__layer *y, int32_t layer,
                       const struct tsr_tensor *x, int64_t head_dim, const char *what) {
  if (x && x->ne[0] == head_dim && x->ne[2] == y->desc.n_head_kv && x->ne[3] == 1) return true;
  fail(g, TSR_ERR_INVALID_ARG, "kv cache: layer %d: new %s rows are not [head_dim, n, n_head_kv]",
       layer, what);
  return false;
}

void tsr_kv_cache_store(struct tsr_graph *g, struct tsr_kv_cache *c, int32_t layer,
                        struct tsr_tensor *k, struct tsr_tensor *v, struct tsr_tensor *cells_idx,
                        struct tsr_tensor **k_all, struct tsr_tensor **v_all) {
  *k_all = *v_all = NULL;
  if (layer < 0 || layer >= c->n_layers) {
    fail(g, TSR_ERR_INVALID_ARG, "kv cache: layer %d %s", layer, "does not exist");
    return;
  }
  struct tsr_kv__layer *y = &c->layers[layer];
  if (y->pool < 0 || y->owner != layer) {
    fail(g, TSR_ERR_INVALID_ARG, "kv cache: layer %d %s", layer,
         "owns no K/V to write (linear, or reads another layer's)");
    return;
  }
  if (!check_rows(g, y, layer, k, y->desc.head_dim_k, "K") ||
      !check_rows(g, y, layer, v, y->desc.head_dim_v, "V"))
    return;
  struct tsr_tensor *kb = buffer(g, c, y, layer, true), *vb = buffer(g, c, y, layer, false);
  if (!kb || !vb) return;
  struct tsr_tensor *ka = tsr_set_rows(g, kb, k, cells_idx);
  struct tsr_tensor *va = tsr_set_rows(g, vb, v, cells_idx);
  if (!ka || !va) return;
  tsr_tensor_set_name(ka, "cache_k_l%d_all", layer);
  tsr_tensor_set_name(va, "cache_v_l%d_all", layer);
  y->g_serial = tsr_graph_serial(g);
  y->g_index = tsr_graph_n_tensors(g) - 1; /* va's index: checked before reuse */
  y->k_all = ka;
  y->v_all = va;
  *k_all = ka;
  *v_all = va;
}

void tsr_kv_cache_layer_views(struct tsr_graph *g, struct tsr_kv_cache *c, int32_t layer,
                              struct tsr_tensor **k_all, struct tsr_tensor **v_all) {
  *k_all = *v_all = NULL;
  if (layer < 0 || layer >= c->n_layers || c->layers[layer].pool < 0) {
    fail(g, TSR_ERR_INVALID_ARG, "kv cache: layer %d %s", layer, "has no K/V in this cache");
    return;
  }
  int32_t owner = c->layers[layer].owner;
  struct tsr_kv__layer *y = &c->layers[owner];
  /* the source was written in this graph: read what its writes produced */
  if (y->g_serial == tsr_graph_serial(g) && y->g_index < tsr_graph_n_tensors(g) &&
      tsr_graph_tensor(g, y->g_index) == y->v_all) {
    *k_all = y->k_all;
    *v_all = y->v_all;
    return;
  }
  struct tsr_tensor *kb = buffer(g, c, y, owner, true), *vb = buffer(g, c, y, owner, false);
  if (!kb || !vb) return;
  *k_all = kb;
  *v_all = vb;
}

struct tsr_tensor *tsr_kv_cache_k_buffer(struct tsr_graph *g, struct tsr_kv_cache *c,
                                         int32_t layer) {
  if (layer < 0 || layer >= c->n_layers || c->layers[layer].pool < 0 ||
      c->layers[layer].owner != layer) {
    fail(g, TSR_ERR_INVALID_ARG, "kv cache: layer %d %s", layer,
         "owns no K to shift (linear, or reads another layer's)");
    return NULL;
  }
  return buffer(g, c, &c->layers[layer], layer, true);
}

void tsr_kv_cache_codec_state(struct tsr_graph *g, const struct tsr_kv_cache *c, int32_t layer,
                              bool is_k, struct tsr_tensor *state[TSR_KV_CODEC_MAX_STATE]) {
  for (int i = 0; i < TSR_KV_CODEC_MAX_STATE; i++) state[i] = NULL;
  if (layer < 0 || layer >= c->n_layers || c->layers[layer].pool < 0) return;
  const int32_t owner = c->layers[layer].owner;
  const struct tsr_kv__layer *y = &c->layers[owner];
  const int side = is_k ? 0 : 1;
  for (int32_t i = 0; i < y->codec_n_state[side]; i++) {
    const int64_t *ne = y->codec_state_ne[side][i];
    state[i] = tsr_new_external(g, TSR_F32, 2, (int64_t[]){ne[0], ne[1]}, y->codec_state[side][i]);
    tsr_tensor_set_name(state[i], "cache_%c_l%d.state%d", is_k ? 'k' : 'v', owner, i);
  }
}
