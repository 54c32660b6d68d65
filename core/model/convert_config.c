/*
** config.json, checked before a converter plugin reads it: every key a
** converter reads (at the top level and in text_config) has the JSON type
** and range its reader and the runtime assume, so a malformed config is
** refused naming the key instead of being read as "absent" and leaving a
** GGUF without a key `tessera run` needs.
**
** null is accepted everywhere and means "not set", as in transformers.
** The checks are per key: combinations (heads dividing, layer patterns the
** runtime can plan) are the converter plugin's, which knows its defaults.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/convert.h"
#include "common/error.h"
#include "model/json.h"

enum want {
  W_INT_POS,     /* an integer >= 1 */
  W_INT_NONNEG,  /* an integer >= 0 */
  W_NUM_POS,     /* a finite number > 0 */
  W_NUM_NONNEG,  /* a finite number >= 0 */
  W_FRACTION,    /* a number in (0, 1] */
  W_NUM,         /* a finite number */
  W_BOOL,
  W_STRING,
  W_ROPE,        /* a RoPE dict: an object whose keys are checked in turn */
  W_OBJECT,      /* text_config: an object checked with this table */
  W_TOKEN_ID,    /* a token id >= 0, or a list of them */
  W_LAYER_TYPES, /* a list of strings, one per layer */
  W_SECTIONS,    /* a list of integers >= 0 */
};

struct key_rule {
  const char *key;
  enum want want;
};

/* Keys the arch converters read (convert_qwen.c, convert_gemma4.c) and the
** tokenizer writer's *_token_id. */
static const struct key_rule g_config_keys[] = {
    {"model_type", W_STRING},
    {"text_config", W_OBJECT},
    {"num_hidden_layers", W_INT_POS},
    {"hidden_size", W_INT_POS},
    {"num_attention_heads", W_INT_POS},
    {"num_key_value_heads", W_INT_POS},
    {"head_dim", W_INT_POS},
    {"vocab_size", W_INT_POS},
    {"max_position_embeddings", W_INT_POS},
    {"global_head_dim", W_INT_POS},
    {"num_global_key_value_heads", W_INT_POS},
    {"linear_num_key_heads", W_INT_POS},
    {"linear_num_value_heads", W_INT_POS},
    {"linear_key_head_dim", W_INT_POS},
    {"linear_value_head_dim", W_INT_POS},
    {"linear_conv_kernel_dim", W_INT_POS},
    {"full_attention_interval", W_INT_POS},
    {"backbone_hidden_size", W_INT_POS},
    {"num_centroids", W_INT_POS},
    {"centroid_intermediate_top_k", W_INT_POS},
    /* 0 may mean "none" here; the plugin checks the ones a model uses */
    {"intermediate_size", W_INT_NONNEG},
    {"moe_intermediate_size", W_INT_NONNEG},
    {"shared_expert_intermediate_size", W_INT_NONNEG},
    {"num_experts_per_tok", W_INT_NONNEG},
    {"top_k_experts", W_INT_NONNEG},
    {"vocab_size_per_layer_input", W_INT_NONNEG},
    {"num_experts", W_INT_NONNEG},
    {"num_local_experts", W_INT_NONNEG},
    {"n_routed_experts", W_INT_NONNEG},
    {"num_kv_shared_layers", W_INT_NONNEG},
    {"hidden_size_per_layer_input", W_INT_NONNEG},
    {"mtp_num_hidden_layers", W_INT_NONNEG},
    {"sliding_window", W_INT_NONNEG},
    {"rope_theta", W_NUM_POS},
    {"global_rope_theta", W_NUM_POS},
    {"rope_global_theta", W_NUM_POS},
    {"rope_theta_global", W_NUM_POS},
    {"rotary_emb_base", W_NUM_POS},
    {"rms_norm_eps", W_NUM_POS},
    {"norm_eps", W_NUM_POS},
    {"layer_norm_eps", W_NUM_POS},
    {"layer_norm_epsilon", W_NUM_POS},
    {"norm_epsilon", W_NUM_POS},
    {"partial_rotary_factor", W_FRACTION},
    {"final_logit_softcapping", W_NUM_NONNEG},
    {"tie_word_embeddings", W_BOOL},
    {"attention_bias", W_BOOL},
    {"attention_k_eq_v", W_BOOL},
    {"use_double_wide_mlp", W_BOOL},
    {"enable_moe_block", W_BOOL},
    {"norm_topk_prob", W_BOOL},
    {"use_ordered_embeddings", W_BOOL},
    {"use_bidirectional_attention", W_STRING},
    {"rope_parameters", W_ROPE},
    {"rope_scaling", W_ROPE},
    {"layer_types", W_LAYER_TYPES},
    {"bos_token_id", W_TOKEN_ID},
    {"eos_token_id", W_TOKEN_ID},
    {"pad_token_id", W_TOKEN_ID},
    {"unk_token_id", W_TOKEN_ID},
    {"sep_token_id", W_TOKEN_ID},
    {"cls_token_id", W_TOKEN_ID},
    {"mask_token_id", W_TOKEN_ID},
};

/* Keys of a RoPE dict (rope_parameters, rope_scaling, and Gemma 4's
** per-layer-kind dicts inside rope_parameters). */
static const struct key_rule g_rope_keys[] = {
    {"rope_type", W_STRING},
    {"type", W_STRING},
    {"rope_theta", W_NUM_POS},
    {"factor", W_NUM_POS},
    {"partial_rotary_factor", W_FRACTION},
    {"original_max_position_embeddings", W_INT_POS},
    {"mrope_section", W_SECTIONS},
    {"mrope_interleaved", W_BOOL},
    {"attention_factor", W_NUM},
    {"attn_factor", W_NUM},
    {"extrapolation_factor", W_NUM},
    {"beta_fast", W_NUM},
    {"beta_slow", W_NUM},
};

#define N_RULES(t) (sizeof t / sizeof t[0])

static const char *expected(enum want w) {
  switch (w) {
  case W_INT_POS: return "an integer of at least 1";
  case W_INT_NONNEG: return "an integer of at least 0";
  case W_NUM_POS: return "a finite number above 0";
  case W_NUM_NONNEG: return "a finite number of at least 0";
  case W_FRACTION: return "a number above 0 and at most 1";
  case W_NUM: return "a finite number";
  case W_BOOL: return "true or false";
  case W_STRING: return "a string";
  case W_ROPE: return "an object (a RoPE dict)";
  case W_OBJECT: return "an object";
  case W_TOKEN_ID: return "a token id (an integer of at least 0) or a list of them";
  case W_LAYER_TYPES: return "a list of strings, one per layer";
  case W_SECTIONS: return "a list of integers of at least 0";
  }
  return "?";
}

void tsr_convert_describe(const void *value, char *buf, size_t n) {
  const cJSON *v = value;
  const char *type = tsr_json_type_name(v);
  const char *a = (!strcmp(type, "object") || !strcmp(type, "array")) ? "an" : "a";
  if (cJSON_IsString(v))
    snprintf(buf, n, "a string \"%.40s%s\"", v->valuestring,
             strlen(v->valuestring) > 40 ? "..." : "");
  else if (cJSON_IsNumber(v)) {
    /* the shortest form that reads back as the same double: 1e-06, not 9.99...e-07 */
    int digits = 15;
    char probe[40];
    snprintf(probe, sizeof probe, "%.*g", digits, v->valuedouble);
    if (strtod(probe, NULL) != v->valuedouble) digits = 17;
    snprintf(buf, n, "the number %.*g", digits, v->valuedouble);
  }
  else if (cJSON_IsBool(v))
    snprintf(buf, n, "%s", cJSON_IsTrue(v) ? "true" : "false");
  else if (cJSON_IsArray(v))
    snprintf(buf, n, "an array of %d", cJSON_GetArraySize(v));
  else
    snprintf(buf, n, "%s %s", a, type);
}

static bool is_int(const cJSON *v, int64_t min) {
  int64_t x;
  return tsr_json_as_i64(v, &x) && x >= min;
}

/* Whether v (not null) is what w asks for; arrays are checked element by
** element, *bad_at getting the first bad index (-1: the value itself). */
static bool fits(const cJSON *v, enum want w, int *bad_at) {
  *bad_at = -1;
  double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
  switch (w) {
  case W_INT_POS: return is_int(v, 1);
  case W_INT_NONNEG: return is_int(v, 0);
  case W_NUM_POS: return isfinite(d) && d > 0;
  case W_NUM_NONNEG: return isfinite(d) && d >= 0;
  case W_FRACTION: return isfinite(d) && d > 0 && d <= 1;
  case W_NUM: return isfinite(d);
  case W_BOOL: return cJSON_IsBool(v);
  case W_STRING: return cJSON_IsString(v) && v->valuestring;
  case W_ROPE:
  case W_OBJECT: return cJSON_IsObject(v);
  case W_TOKEN_ID:
  case W_LAYER_TYPES:
  case W_SECTIONS:
    if (w == W_TOKEN_ID && cJSON_IsNumber(v)) return is_int(v, 0);
    if (!cJSON_IsArray(v)) return false;
    int i = 0;
    for (const cJSON *e = v->child; e; e = e->next, i++) {
      bool ok = w == W_LAYER_TYPES ? cJSON_IsString(e) && e->valuestring : is_int(e, 0);
      if (!ok) {
        *bad_at = i;
        return false;
      }
    }
    return true;
  }
  return false;
}

static tsr_status refuse(const char *label, const char *prefix, const char *key, int bad_at,
                         const cJSON *v, enum want w) {
  char what[96], at[24] = "";
  const cJSON *shown = bad_at >= 0 ? cJSON_GetArrayItem(v, bad_at) : v;
  tsr_convert_describe(shown, what, sizeof what);
  if (bad_at >= 0) snprintf(at, sizeof at, "[%d]", bad_at);
  return tsr_error_set(TSR_ERR_FORMAT, "%s: %s%s%s should be %s (or null), found %s", label,
                       prefix, key, at, expected(w), what);
}

static tsr_status check_rope(const cJSON *rope, const char *label, const char *path, int depth) {
  for (const cJSON *c = rope->child; c; c = c->next) {
    if (!c->string || cJSON_IsNull(c)) continue;
    char sub[160];
    snprintf(sub, sizeof sub, "%s.", path);
    if (cJSON_IsObject(c) && depth == 0) {
      /* Gemma 4 keeps one dict per layer kind (full_attention, sliding_attention) */
      snprintf(sub, sizeof sub, "%s.%s", path, c->string);
      tsr_status st = check_rope(c, label, sub, depth + 1);
      if (st != TSR_OK) return st;
      continue;
    }
    for (size_t r = 0; r < N_RULES(g_rope_keys); r++) {
      int bad_at;
      if (strcmp(c->string, g_rope_keys[r].key) || fits(c, g_rope_keys[r].want, &bad_at))
        continue;
      return refuse(label, sub, c->string, bad_at, c, g_rope_keys[r].want);
    }
  }
  return TSR_OK;
}

/* One object of the config: the top level (prefix "") or text_config. n_layer_outer is
** the top level's num_hidden_layers (-1: none), which text_config inherits. */
static tsr_status check_object(const cJSON *obj, const char *label, const char *prefix,
                               int64_t n_layer_outer) {
  int64_t n_layer = n_layer_outer;
  const cJSON *nl = cJSON_GetObjectItemCaseSensitive(obj, "num_hidden_layers");
  if (nl && !tsr_json_as_i64(nl, &n_layer)) n_layer = -1; /* refused below */
  for (size_t r = 0; r < N_RULES(g_config_keys); r++) {
    const struct key_rule *k = &g_config_keys[r];
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, k->key);
    if (!v || cJSON_IsNull(v)) continue;
    if (k->want == W_OBJECT && *prefix) continue; /* text_config only at the top */
    int bad_at;
    if (!fits(v, k->want, &bad_at)) return refuse(label, prefix, k->key, bad_at, v, k->want);
    char path[96];
    snprintf(path, sizeof path, "%s%s", prefix, k->key);
    tsr_status st = TSR_OK;
    if (k->want == W_ROPE) st = check_rope(v, label, path, 0);
    else if (k->want == W_OBJECT) st = check_object(v, label, "text_config.", n_layer);
    else if (k->want == W_LAYER_TYPES && n_layer >= 1 && cJSON_GetArraySize(v) != n_layer)
      /* transformers refuses this too (layer_type_validation) */
      st = tsr_error_set(TSR_ERR_FORMAT, "%s: %s has %d entries, but %snum_hidden_layers is "
                         "%lld (one entry per layer)", label, path, cJSON_GetArraySize(v),
                         nl ? prefix : "", (long long)n_layer);
    if (st != TSR_OK) return st;
  }
  return TSR_OK;
}

tsr_status tsr_convert_check_config(const void *config, const char *label) {
  const cJSON *root = config;
  if (!cJSON_IsObject(root))
    return tsr_error_set(TSR_ERR_FORMAT, "%s: a JSON %s, not an object", label,
                         tsr_json_type_name(root));
  return check_object(root, label, "", -1);
}
