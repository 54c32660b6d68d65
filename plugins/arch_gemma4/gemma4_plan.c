/*
** The Gemma 4 layer plan: which layers slide, their head dims and KV heads,
** and which layers share another layer's K/V (gemma4.h says how).
*/
#include "gemma4.h"

static bool head_dims_ok(int32_t k, int32_t v) { return k > 0 && v > 0; }

tsr_status gemma4_plan(const struct tsr_host *host, const char *arch,
                       const struct gemma4_hparams *hp, struct tsr_arch_layer *layers,
                       int32_t n_layers_max, int32_t *kv_source) {
  const int32_t n = hp->n_layer;
  if (n <= 0 || n > GEMMA4_MAX_LAYERS)
    return host->set_error(TSR_ERR_FORMAT, "%s.block_count is %d (1..%d supported)", arch, n,
                           GEMMA4_MAX_LAYERS);
  if (n > n_layers_max)
    return host->set_error(TSR_ERR_UNSUPPORTED, "%s: %d layers, more than the %d supported", arch,
                           n, n_layers_max);
  if (hp->n_head <= 0 || !head_dims_ok(hp->head_dim_k, hp->head_dim_v) ||
      !head_dims_ok(hp->head_dim_k_swa, hp->head_dim_v_swa))
    return host->set_error(TSR_ERR_FORMAT, "%s: inconsistent attention hyperparameters "
                           "(head_count %d, key_length %d, value_length %d, key_length_swa %d, "
                           "value_length_swa %d)", arch, hp->n_head, hp->head_dim_k,
                           hp->head_dim_v, hp->head_dim_k_swa, hp->head_dim_v_swa);
  if (hp->n_kv_shared < 0 || hp->n_kv_shared > n)
    return host->set_error(TSR_ERR_FORMAT, "%s.attention.shared_kv_layers is %d with %d layers",
                           arch, hp->n_kv_shared, n);
  bool any_swa = false;
  for (int32_t l = 0; l < n; l++) any_swa |= hp->swa[l];
  if (any_swa && hp->window <= 0)
    return host->set_error(TSR_ERR_FORMAT, "%s.attention.sliding_window is %d but layers slide",
                           arch, hp->window);

  const int32_t first_shared = n - hp->n_kv_shared;
  /* the last owner of each kind below the shared block */
  int32_t last_owner[2] = {-1, -1};
  for (int32_t l = 0; l < first_shared; l++) last_owner[hp->swa[l] ? 1 : 0] = l;

  for (int32_t l = 0; l < n; l++) {
    const bool swa = hp->swa[l];
    const int32_t kv = hp->n_head_kv[l];
    int32_t src = GEMMA4_KV_OWN;
    if (l >= first_shared) src = last_owner[swa ? 1 : 0] >= 0 ? last_owner[swa ? 1 : 0]
                                                              : GEMMA4_KV_TARGET;
    /* a shared layer reads K/V with the owner's head count; GQA must still divide */
    int32_t kv_read = src >= 0 ? hp->n_head_kv[src] : kv;
    if (kv_read <= 0 || hp->n_head % kv_read)
      return host->set_error(TSR_ERR_FORMAT, "%s: layer %d has head_count %d and head_count_kv "
                             "%d (must divide)", arch, l, hp->n_head, kv_read);
    layers[l] = (struct tsr_arch_layer){
        .kind = swa ? TSR_LAYER_SLIDING : TSR_LAYER_FULL,
        .n_head = hp->n_head,
        .n_head_kv = kv_read,
        .head_dim_k = swa ? hp->head_dim_k_swa : hp->head_dim_k,
        .head_dim_v = swa ? hp->head_dim_v_swa : hp->head_dim_v,
        .window = swa ? hp->window : 0,
        .state_bytes = 0,
        .kv_shared_from = src == GEMMA4_KV_OWN ? 0 : src == GEMMA4_KV_TARGET ? -1 : src + 1,
    };
    if (kv_source) kv_source[l] = src;
  }
  return TSR_OK;
}
