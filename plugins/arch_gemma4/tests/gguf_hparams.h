/*
** Test helper: a GGUF's Gemma 4 hyperparameters read with the core's reader
** (which reads arrays), so the layer plan can be checked on any file
** whatever the plugin ABI lets the plugin itself read.
*/
#ifndef TSR_GEMMA4_TEST_GGUF_HPARAMS_H
#define TSR_GEMMA4_TEST_GGUF_HPARAMS_H

#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "gemma4.h"
#include "model/gguf.h"

static tsr_status hp_u32(const struct tsr_gguf *g, const char *arch, const char *suffix,
                         int32_t *out) {
  char key[128];
  uint32_t v;
  snprintf(key, sizeof key, "%s.%s", arch, suffix);
  tsr_status st = tsr_gguf_get_u32(g, key, &v);
  if (st == TSR_OK) *out = (int32_t)v;
  return st;
}

/* A scalar for every layer, or an array with one element per layer. */
static tsr_status hp_per_layer(const struct tsr_gguf *g, const char *key, int32_t n, int32_t *out,
                               bool *bool_out) {
  int64_t idx = tsr_gguf_find_key(g, key);
  if (idx < 0) return tsr_error_set(TSR_ERR_FORMAT, "no key %s", key);
  const struct tsr_gguf_kv *kv = tsr_gguf_kv_at(g, idx);
  if (kv->type != TSR_GGUF_ARRAY) {
    uint32_t v;
    tsr_status st = tsr_gguf_get_u32(g, key, &v);
    for (int32_t l = 0; l < n && st == TSR_OK; l++) out[l] = (int32_t)v;
    return st;
  }
  if (kv->n != (uint64_t)n) return tsr_error_set(TSR_ERR_FORMAT, "%s: %llu elements", key,
                                                 (unsigned long long)kv->n);
  for (int32_t l = 0; l < n; l++) {
    if (kv->elem_type == TSR_GGUF_BOOL) {
      int8_t b;
      memcpy(&b, (const char *)kv->data + l, 1);
      if (bool_out) bool_out[l] = b != 0;
      else out[l] = b;
    } else {
      int64_t v;
      tsr_status st = tsr_gguf_arr_i64(g, kv, (uint64_t)l, &v);
      if (st != TSR_OK) return st;
      if (bool_out) bool_out[l] = v != 0;
      else out[l] = (int32_t)v;
    }
  }
  return TSR_OK;
}

static tsr_status hparams_from_gguf(const struct tsr_gguf *g, struct gemma4_hparams *hp) {
  const char *arch;
  memset(hp, 0, sizeof *hp);
  tsr_status st = tsr_gguf_get_str(g, "general.architecture", &arch);
  if (st == TSR_OK) st = hp_u32(g, arch, "block_count", &hp->n_layer);
  if (st == TSR_OK) st = hp_u32(g, arch, "attention.head_count", &hp->n_head);
  if (st == TSR_OK) st = hp_u32(g, arch, "attention.key_length", &hp->head_dim_k);
  if (st == TSR_OK) st = hp_u32(g, arch, "attention.value_length", &hp->head_dim_v);
  if (st == TSR_OK) st = hp_u32(g, arch, "attention.key_length_swa", &hp->head_dim_k_swa);
  if (st == TSR_OK) st = hp_u32(g, arch, "attention.value_length_swa", &hp->head_dim_v_swa);
  if (st == TSR_OK) st = hp_u32(g, arch, "attention.sliding_window", &hp->window);
  if (st == TSR_OK) st = hp_u32(g, arch, "attention.shared_kv_layers", &hp->n_kv_shared);
  char key[128];
  snprintf(key, sizeof key, "%s.attention.head_count_kv", arch);
  if (st == TSR_OK) st = hp_per_layer(g, key, hp->n_layer, hp->n_head_kv, NULL);
  snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", arch);
  if (st == TSR_OK) st = hp_per_layer(g, key, hp->n_layer, NULL, hp->swa);
  return st;
}

#endif
