/*
** tessera plugin ABI: reading a model file (host->gguf). The host validated
** the GGUF when it opened it; an arch reads its hyperparameters and checks
** its tensors through these calls, whose errors name the key or tensor.
*/
#ifndef TESSERA_PLUGIN_GGUF_H
#define TESSERA_PLUGIN_GGUF_H

#include "tessera/plugin/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

struct tsr_host_gguf {
  uint32_t struct_size;
  /* keys, with type checks that name the key */
  tsr_status (*get_u32)(const struct tsr_gguf *model, const char *key, uint32_t *out);
  tsr_status (*get_f32)(const struct tsr_gguf *model, const char *key, float *out);
  tsr_status (*get_str)(const struct tsr_gguf *model, const char *key, const char **out);
  tsr_status (*get_bool)(const struct tsr_gguf *model, const char *key, bool *out);
  /* 1 if the key exists, else 0 */
  int (*has_key)(const struct tsr_gguf *model, const char *key);
  /* arrays (per-layer hyperparameters): length, then elements with the scalar
  ** getters' conversion rules */
  tsr_status (*arr_len)(const struct tsr_gguf *model, const char *key, int64_t *n);
  tsr_status (*arr_i64)(const struct tsr_gguf *model, const char *key, int64_t i, int64_t *out);
  tsr_status (*arr_bool)(const struct tsr_gguf *model, const char *key, int64_t i, bool *out);
  /* 1 if the tensor exists, else 0 */
  int (*has_weight)(const struct tsr_gguf *model, const char *name);
  /* Checking a model file against its hyperparameters (an arch's validate());
  ** each error names the key or tensor, what was expected and what was found. */
  /* a float key that must be finite and > 0 (epsilons, RoPE bases and
  ** scaling factors, softcaps): "qwen3.rope.freq_base is inf: must be a
  ** finite positive number" */
  tsr_status (*f32_positive)(const struct tsr_gguf *model, const char *key, float *out);
  /* a tensor's dims as stored (GGUF order, innermost first; 1 past n_dims);
  ** TSR_ERR_FORMAT naming it when absent */
  tsr_status (*weight_shape)(const struct tsr_gguf *model, const char *name, int32_t *n_dims,
                             int64_t ne[4]);
  /* the tensor present with dims ne[0..n_dims) (-1: any; 1 past n_dims).
  ** why (or NULL) holds n_dims entries, each NULL or what implies that dim
  ** ("qwen3.embedding_length"), so a mismatch reads "qwen3.embedding_length
  ** is 1024 but token_embd.weight has 896 columns (shape [896, 151936])" */
  tsr_status (*check_weight)(const struct tsr_gguf *model, const char *name, int32_t n_dims,
                             const int64_t *ne, const char *const *why);
  /* blk.L.SUFFIX in each of the n layers listed, or in none of them: the
  ** first listed decides, *present says which. A mix fails naming the first
  ** layer that differs: "blk.3.attn_q_norm.weight is missing (layers 0-2,
  ** 4-27 have it)" */
  tsr_status (*check_layer_weights)(const struct tsr_gguf *model, const char *suffix,
                                    const int32_t *layers, int32_t n, bool *present);
};

#ifdef __cplusplus
}
#endif

#endif /* TESSERA_PLUGIN_GGUF_H */
