/*
** Gemma 4 conversion internals: the checkpoint's hyperparameters as
** llama.cpp's converter reads them (convert_gemma4.c), used by the metadata
** writer and the tensor writer (convert_gemma4_tensors.c).
*/
#ifndef TSR_CONVERT_GEMMA4_H
#define TSR_CONVERT_GEMMA4_H

#include <stdbool.h>
#include <stdint.h>

#include "gemma4.h"

struct gemma4_cfg {
  const struct tsr_host *host;
  struct tsr_convert *cv;
  bool assistant;     /* model_type gemma4_assistant: GGUF arch gemma4-assistant */
  const char *arch;   /* "gemma4" or "gemma4-assistant" */
  const char *prefix; /* where the decoder's tensors live: "model.language_model." or "model." */

  int64_t n_layer, n_embd, n_ff, n_head, n_head_kv, n_ctx, vocab;
  int64_t head_dim, head_dim_full; /* sliding / full layers */
  int64_t n_head_kv_full;          /* full layers' KV heads, or -1: same as n_head_kv */
  int64_t window, n_kv_shared;
  int64_t n_embd_per_layer, vocab_per_layer; /* per-layer inputs (PLE); 0: none */
  bool k_eq_v, double_wide, moe, causal;
  int64_t n_expert, n_expert_used, n_ff_exp; /* -1: not in the config */
  double eps, softcap;                       /* softcap 0: none */
  double theta, theta_swa;                   /* theta_swa < 0: not in the config */
  double rotary_full;                        /* proportional rope's partial_rotary_factor */
  double rotary_swa;                         /* rope_parameters.partial_rotary_factor, or 1 */
  int64_t n_embd_backbone;                   /* assistant: the target's hidden size */
  int64_t n_centroids, centroid_top_k;       /* assistant's ordered embeddings; 0: none */
  bool swa[GEMMA4_MAX_LAYERS];
};

/* First layer that computes no K/V of its own. */
static inline int64_t gemma4_first_shared(const struct gemma4_cfg *c) {
  return c->n_layer - c->n_kv_shared;
}
/* Head dim, KV heads and FFN width of layer l, as the checkpoint's shapes have them. */
static inline int64_t gemma4_layer_head_dim(const struct gemma4_cfg *c, int64_t l) {
  return c->swa[l] ? c->head_dim : c->head_dim_full;
}
static inline int64_t gemma4_layer_kv_heads(const struct gemma4_cfg *c, int64_t l) {
  return !c->swa[l] && c->n_head_kv_full > 0 ? c->n_head_kv_full : c->n_head_kv;
}
static inline int64_t gemma4_layer_ff(const struct gemma4_cfg *c, int64_t l) {
  return c->double_wide && l >= gemma4_first_shared(c) ? 2 * c->n_ff : c->n_ff;
}

/* Writes every tensor: the decoder's, the derived rope_freqs, and the
** assistant's projections. */
tsr_status gemma4_convert_tensors(struct gemma4_cfg *c);

#endif
