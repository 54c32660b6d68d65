/*
** tessera convert for Gemma 4: config.json -> the GGUF metadata llama.cpp's
** converter writes (its Gemma4Model / Gemma4AssistantModel classes), then
** the tokenizer and the tensors (convert_gemma4_tensors.c).
**
** llama.cpp reads the config through transformers (AutoConfig), which
** flattens text_config over the root and fills Gemma4TextConfig's defaults;
** this file reads config.json the same way: a key is looked up under
** text_config first (a shallow merge, as Python's {**root, **text_config}),
** and an absent key takes transformers 5.17's default where llama.cpp would
** see one. Shape-defining keys (layers, widths, heads) are required: a
** default there would only produce a file whose tensors do not fit it.
*/
#include <stdio.h>
#include <string.h>

#include "convert_gemma4.h"

#define MAX_PATH_LEN 160

/* config.json path of key: "text_config.<key>" when text_config holds its
** first component, else "<key>" at the root. */
static const char *cfg_path(const struct gemma4_cfg *c, const char *key, char *buf) {
  size_t first = strcspn(key, ".");
  snprintf(buf, MAX_PATH_LEN, "text_config.%.*s", (int)first, key);
  if (c->host->convert->hf_has(c->cv, buf)) {
    snprintf(buf, MAX_PATH_LEN, "text_config.%s", key);
    return buf;
  }
  snprintf(buf, MAX_PATH_LEN, "%s", key);
  return buf;
}

static bool has(const struct gemma4_cfg *c, const char *key) {
  char p[MAX_PATH_LEN];
  return c->host->convert->hf_has(c->cv, cfg_path(c, key, p));
}

static tsr_status req_i64(const struct gemma4_cfg *c, const char *key, int64_t *out) {
  char p[MAX_PATH_LEN];
  tsr_status st = c->host->convert->hf_i64(c->cv, cfg_path(c, key, p), out);
  if (st == TSR_OK && *out < 0)
    return c->host->set_error(TSR_ERR_FORMAT, "config.json: %s is %lld", p, (long long)*out);
  return st;
}

/* The value, or dflt when the config lacks the key (-1: "not set" to the caller). */
static tsr_status opt_i64(const struct gemma4_cfg *c, const char *key, int64_t dflt, int64_t *out) {
  *out = dflt;
  return has(c, key) ? req_i64(c, key, out) : TSR_OK;
}

static tsr_status opt_f64(const struct gemma4_cfg *c, const char *key, double dflt, double *out) {
  char p[MAX_PATH_LEN];
  *out = dflt;
  return has(c, key) ? c->host->convert->hf_f64(c->cv, cfg_path(c, key, p), out) : TSR_OK;
}

static tsr_status opt_bool(const struct gemma4_cfg *c, const char *key, bool dflt, bool *out) {
  char p[MAX_PATH_LEN];
  *out = dflt;
  return has(c, key) ? c->host->convert->hf_bool(c->cv, cfg_path(c, key, p), out) : TSR_OK;
}

static tsr_status opt_str(const struct gemma4_cfg *c, const char *key, const char **out) {
  char p[MAX_PATH_LEN];
  *out = NULL;
  return has(c, key) ? c->host->convert->hf_str(c->cv, cfg_path(c, key, p), out) : TSR_OK;
}

/* layer_types, or transformers' default (every 6th layer full); the last
** layer is forced full as Gemma4TextConfig does. */
static tsr_status read_layer_types(struct gemma4_cfg *c) {
  const struct tsr_host *h = c->host;
  if (c->n_layer <= 0 || c->n_layer > GEMMA4_MAX_LAYERS)
    return h->set_error(TSR_ERR_FORMAT, "config.json: num_hidden_layers is %lld (1..%d supported)",
                        (long long)c->n_layer, GEMMA4_MAX_LAYERS);
  if (!has(c, "layer_types")) {
    for (int64_t l = 0; l < c->n_layer; l++) c->swa[l] = (l + 1) % 6 != 0;
  } else {
    char p[MAX_PATH_LEN];
    cfg_path(c, "layer_types", p);
    int64_t n;
    tsr_status st = h->convert->hf_arr_len(c->cv, p, &n);
    if (st != TSR_OK) return st;
    if (n != c->n_layer)
      return h->set_error(TSR_ERR_FORMAT, "config.json: %s has %lld entries for %lld layers", p,
                          (long long)n, (long long)c->n_layer);
    for (int64_t l = 0; l < n; l++) {
      const char *t;
      if ((st = h->convert->hf_arr_str(c->cv, p, l, &t)) != TSR_OK) return st;
      if (strcmp(t, "sliding_attention") && strcmp(t, "full_attention"))
        return h->set_error(TSR_ERR_UNSUPPORTED, "config.json: %s[%lld] is '%s' (gemma4 has "
                            "sliding_attention and full_attention)", p, (long long)l, t);
      c->swa[l] = !strcmp(t, "sliding_attention");
    }
  }
  c->swa[c->n_layer - 1] = false;
  return TSR_OK;
}

/* Full layers' head dim and KV heads. transformers 5.17 keeps them in
** per_layer_config (what its save_pretrained writes) and otherwise builds
** that from global_head_dim (default 512) and, only when attention_k_eq_v,
** num_global_key_value_heads; llama.cpp takes the first full layer's entry. */
static tsr_status read_full_layer_overrides(struct gemma4_cfg *c) {
  c->head_dim_full = -1;
  c->n_head_kv_full = -1;
  if (has(c, "per_layer_config")) {
    for (int64_t l = 0; l < c->n_layer; l++) {
      if (c->swa[l]) continue;
      char key[96];
      tsr_status st = TSR_OK;
      snprintf(key, sizeof key, "per_layer_config.%lld.head_dim", (long long)l);
      if (c->head_dim_full < 0 && has(c, key)) st = req_i64(c, key, &c->head_dim_full);
      snprintf(key, sizeof key, "per_layer_config.%lld.num_key_value_heads", (long long)l);
      if (st == TSR_OK && c->n_head_kv_full < 0 && has(c, key))
        st = req_i64(c, key, &c->n_head_kv_full);
      if (st != TSR_OK) return st;
    }
    if (c->head_dim_full < 0)
      return c->host->set_error(TSR_ERR_FORMAT, "config.json: per_layer_config gives no full "
                                "layer a head_dim");
    return TSR_OK;
  }
  tsr_status st = opt_i64(c, "global_head_dim", 512, &c->head_dim_full);
  if (st == TSR_OK && c->k_eq_v) st = opt_i64(c, "num_global_key_value_heads", -1, &c->n_head_kv_full);
  return st;
}

/* rope_parameters per layer kind; transformers' defaults when absent. The
** full layers' rope must be "proportional" (llama.cpp derives rope_freqs
** from it and refuses anything else). */
static tsr_status read_rope(struct gemma4_cfg *c) {
  const struct tsr_host *h = c->host;
  c->theta = 1e6;
  c->theta_swa = 1e4;
  c->rotary_full = 0.25;
  c->rotary_swa = 1.0;
  if (!has(c, "rope_parameters")) return TSR_OK;
  if (!has(c, "rope_parameters.full_attention"))
    return h->set_error(TSR_ERR_UNSUPPORTED, "config.json: rope_parameters has no full_attention "
                        "entry (gemma4 keeps one per layer kind)");
  const char *type;
  tsr_status st = opt_str(c, "rope_parameters.full_attention.rope_type", &type);
  if (st == TSR_OK && (!type || strcmp(type, "proportional")))
    return h->set_error(TSR_ERR_UNSUPPORTED, "config.json: full_attention rope_type is '%s'; "
                        "gemma4 conversion handles 'proportional' only", type ? type : "(none)");
  if (st == TSR_OK && !has(c, "rope_parameters.full_attention.partial_rotary_factor"))
    return h->set_error(TSR_ERR_FORMAT, "config.json: rope_parameters.full_attention has no "
                        "partial_rotary_factor");
  if (st == TSR_OK)
    st = opt_f64(c, "rope_parameters.full_attention.partial_rotary_factor", 0, &c->rotary_full);
  if (st == TSR_OK) st = opt_f64(c, "rope_parameters.full_attention.rope_theta", 1e6, &c->theta);
  /* the sliding layers' rope is plain: a scaling named there would be dropped */
  if (st == TSR_OK) st = opt_str(c, "rope_parameters.sliding_attention.rope_type", &type);
  if (st == TSR_OK && type && strcmp(type, "default"))
    return h->set_error(TSR_ERR_UNSUPPORTED, "config.json: rope_parameters.sliding_attention."
                        "rope_type is '%s'; gemma4 conversion handles 'default' only", type);
  /* written only when the config has it, as llama.cpp does */
  if (st == TSR_OK)
    st = opt_f64(c, "rope_parameters.sliding_attention.rope_theta", -1, &c->theta_swa);
  /* llama.cpp scales the sliding rotary dims by a top-level factor only */
  if (st == TSR_OK) st = opt_f64(c, "rope_parameters.partial_rotary_factor", 1.0, &c->rotary_swa);
  if (st == TSR_OK && !(c->rotary_full > 0 && c->rotary_full <= 1))
    st = h->set_error(TSR_ERR_FORMAT, "config.json: partial_rotary_factor %g of full layers",
                      c->rotary_full);
  return st;
}

/* What the runtime's layer plan and RoPE need (gemma4_plan.c refuses a file
** without it): whole GQA groups on every layer kind, a window where layers
** slide, and an even number of rotated dims on sliding layers. */
static tsr_status check_attention(const struct gemma4_cfg *c) {
  const struct tsr_host *h = c->host;
  if (c->n_head % c->n_head_kv)
    return h->set_error(TSR_ERR_FORMAT, "config.json: num_attention_heads %lld is not a multiple "
                        "of num_key_value_heads %lld", (long long)c->n_head,
                        (long long)c->n_head_kv);
  if (c->n_head_kv_full > 0 && c->n_head % c->n_head_kv_full)
    return h->set_error(TSR_ERR_FORMAT, "config.json: num_attention_heads %lld is not a multiple "
                        "of the full layers' %lld KV heads", (long long)c->n_head,
                        (long long)c->n_head_kv_full);
  bool any_swa = false;
  for (int64_t l = 0; l < c->n_layer; l++) any_swa |= c->swa[l];
  if (any_swa && c->window < 1)
    return h->set_error(TSR_ERR_FORMAT, "config.json: sliding_window is %lld, but layer_types "
                        "has sliding_attention layers", (long long)c->window);
  const int64_t n_rot_swa = (int64_t)((double)c->head_dim * c->rotary_swa);
  if (any_swa && (n_rot_swa < 2 || n_rot_swa % 2))
    return h->set_error(TSR_ERR_FORMAT, "config.json: head_dim %lld with partial_rotary_factor "
                        "%g rotates %lld dimensions on sliding layers; RoPE needs an even count "
                        "of at least 2", (long long)c->head_dim, c->rotary_swa,
                        (long long)n_rot_swa);
  return TSR_OK;
}

static tsr_status read_config(struct gemma4_cfg *c) {
  tsr_status st = req_i64(c, "num_hidden_layers", &c->n_layer);
  if (st == TSR_OK) st = req_i64(c, "hidden_size", &c->n_embd);
  if (st == TSR_OK) st = req_i64(c, "intermediate_size", &c->n_ff);
  if (st == TSR_OK) st = req_i64(c, "num_attention_heads", &c->n_head);
  if (st == TSR_OK) st = req_i64(c, "num_key_value_heads", &c->n_head_kv);
  if (st == TSR_OK) st = req_i64(c, "vocab_size", &c->vocab);
  if (st == TSR_OK) st = opt_i64(c, "head_dim", 256, &c->head_dim);
  if (st == TSR_OK) st = opt_i64(c, "max_position_embeddings", 131072, &c->n_ctx);
  if (st == TSR_OK) st = opt_i64(c, "sliding_window", 512, &c->window);
  if (st == TSR_OK) st = opt_i64(c, "num_kv_shared_layers", 0, &c->n_kv_shared);
  if (st == TSR_OK) st = opt_i64(c, "hidden_size_per_layer_input", 256, &c->n_embd_per_layer);
  if (st == TSR_OK) st = opt_i64(c, "vocab_size_per_layer_input", 262144, &c->vocab_per_layer);
  if (st == TSR_OK) st = opt_f64(c, "rms_norm_eps", 1e-6, &c->eps);
  if (st == TSR_OK) st = opt_f64(c, "final_logit_softcapping", 0, &c->softcap);
  if (st == TSR_OK) st = opt_bool(c, "attention_k_eq_v", false, &c->k_eq_v);
  if (st == TSR_OK) st = opt_bool(c, "use_double_wide_mlp", false, &c->double_wide);
  if (st == TSR_OK) st = opt_bool(c, "enable_moe_block", false, &c->moe);
  if (st == TSR_OK) st = opt_i64(c, "num_experts", -1, &c->n_expert);
  if (st == TSR_OK) st = opt_i64(c, "top_k_experts", -1, &c->n_expert_used);
  if (st == TSR_OK) st = opt_i64(c, "moe_intermediate_size", -1, &c->n_ff_exp);
  const char *bidir = NULL;
  if (st == TSR_OK) st = opt_str(c, "use_bidirectional_attention", &bidir);
  c->causal = !(bidir && !strcmp(bidir, "all"));
  if (st == TSR_OK) st = read_layer_types(c);
  if (st == TSR_OK) st = read_full_layer_overrides(c);
  if (st == TSR_OK) st = read_rope(c);
  if (st == TSR_OK && c->assistant)
    st = c->host->convert->hf_i64(c->cv, "backbone_hidden_size", &c->n_embd_backbone);
  bool ordered = false;
  if (st == TSR_OK && c->assistant && c->host->convert->hf_has(c->cv, "use_ordered_embeddings"))
    st = c->host->convert->hf_bool(c->cv, "use_ordered_embeddings", &ordered);
  if (st == TSR_OK && ordered) {
    st = c->host->convert->hf_i64(c->cv, "num_centroids", &c->n_centroids);
    if (st == TSR_OK)
      st = c->host->convert->hf_i64(c->cv, "centroid_intermediate_top_k", &c->centroid_top_k);
    if (st == TSR_OK && (c->n_centroids <= 0 || c->centroid_top_k <= 0 ||
                         c->centroid_top_k > c->n_centroids || c->vocab % c->n_centroids))
      return c->host->set_error(TSR_ERR_FORMAT, "config.json: num_centroids %lld, "
                                "centroid_intermediate_top_k %lld and vocab_size %lld do not "
                                "make whole clusters", (long long)c->n_centroids,
                                (long long)c->centroid_top_k, (long long)c->vocab);
  }
  if (st != TSR_OK) return st;

  const struct tsr_host *h = c->host;
  if (!c->n_embd || !c->n_ff || !c->n_head || !c->n_head_kv || !c->head_dim ||
      c->head_dim_full <= 0 || c->head_dim_full % 2 || !c->vocab)
    return h->set_error(TSR_ERR_FORMAT, "config.json: a zero size (hidden_size %lld, "
                        "intermediate_size %lld, heads %lld/%lld kv, head_dim %lld, global head "
                        "dim %lld, vocab_size %lld)", (long long)c->n_embd, (long long)c->n_ff,
                        (long long)c->n_head, (long long)c->n_head_kv, (long long)c->head_dim,
                        (long long)c->head_dim_full, (long long)c->vocab);
  if (c->n_kv_shared > c->n_layer)
    return h->set_error(TSR_ERR_FORMAT, "config.json: num_kv_shared_layers %lld with %lld layers",
                        (long long)c->n_kv_shared, (long long)c->n_layer);
  if (c->moe && (c->n_expert <= 0 || c->n_expert_used <= 0 || c->n_ff_exp <= 0))
    return h->set_error(TSR_ERR_FORMAT, "config.json: enable_moe_block needs num_experts, "
                        "top_k_experts and moe_intermediate_size");
  if (c->moe && c->n_expert_used > c->n_expert)
    return h->set_error(TSR_ERR_FORMAT, "config.json: top_k_experts is %lld; expected 1 to "
                        "num_experts (%lld)", (long long)c->n_expert_used, (long long)c->n_expert);
  if ((st = check_attention(c)) != TSR_OK) return st;
  if (c->assistant && c->n_embd_backbone <= 0)
    return h->set_error(TSR_ERR_FORMAT, "config.json: backbone_hidden_size is %lld",
                        (long long)c->n_embd_backbone);
  return TSR_OK;
}

/* ---- metadata ------------------------------------------------------------ */

static const char *key_of(const struct gemma4_cfg *c, const char *suffix, char *buf) {
  snprintf(buf, MAX_PATH_LEN, "%s.%s", c->arch, suffix);
  return buf;
}

static tsr_status put_u32(struct gemma4_cfg *c, const char *suffix, int64_t v) {
  char k[MAX_PATH_LEN];
  if (v < 0 || v > (int64_t)UINT32_MAX)
    return c->host->set_error(TSR_ERR_FORMAT, "%s would be %lld, outside u32",
                              key_of(c, suffix, k), (long long)v);
  return c->host->convert->out_u32(c->cv, key_of(c, suffix, k), (uint32_t)v);
}

static tsr_status put_f32(struct gemma4_cfg *c, const char *suffix, double v) {
  char k[MAX_PATH_LEN];
  return c->host->convert->out_f32(c->cv, key_of(c, suffix, k), (float)v);
}

static tsr_status put_arr_i32(struct gemma4_cfg *c, const char *suffix, const int32_t *v) {
  char k[MAX_PATH_LEN];
  return c->host->convert->out_arr_i32(c->cv, key_of(c, suffix, k), v, c->n_layer);
}

/* the sliding/full pattern, a bool per layer as llama.cpp writes it */
static tsr_status put_swa_pattern(struct gemma4_cfg *c) {
  char k[MAX_PATH_LEN];
  return c->host->convert->out_arr_bool(c->cv, key_of(c, "attention.sliding_window_pattern", k),
                                        c->swa, c->n_layer);
}

static tsr_status write_metadata(struct gemma4_cfg *c) {
  const struct tsr_host *h = c->host;
  int32_t arr[GEMMA4_MAX_LAYERS];
  char k[MAX_PATH_LEN];
  tsr_status st = put_u32(c, "block_count", c->n_layer);
  if (st == TSR_OK) st = put_u32(c, "context_length", c->n_ctx);
  if (st == TSR_OK) st = put_u32(c, "embedding_length", c->n_embd);
  if (st == TSR_OK && c->double_wide) {
    for (int64_t l = 0; l < c->n_layer; l++) arr[l] = (int32_t)gemma4_layer_ff(c, l);
    st = put_arr_i32(c, "feed_forward_length", arr);
  } else if (st == TSR_OK) {
    st = put_u32(c, "feed_forward_length", c->n_ff);
  }
  if (st == TSR_OK) st = put_u32(c, "attention.head_count", c->n_head);
  if (st == TSR_OK && c->n_head_kv_full > 0) {
    for (int64_t l = 0; l < c->n_layer; l++) arr[l] = (int32_t)gemma4_layer_kv_heads(c, l);
    st = put_arr_i32(c, "attention.head_count_kv", arr);
  } else if (st == TSR_OK) {
    st = put_u32(c, "attention.head_count_kv", c->n_head_kv);
  }
  if (st == TSR_OK && !c->causal)
    st = h->convert->out_bool(c->cv, key_of(c, "attention.causal", k), false);
  if (st == TSR_OK) st = put_f32(c, "rope.freq_base", c->theta);
  if (st == TSR_OK && c->theta_swa >= 0) st = put_f32(c, "rope.freq_base_swa", c->theta_swa);
  if (st == TSR_OK) st = put_f32(c, "attention.layer_norm_rms_epsilon", c->eps);
  if (st == TSR_OK && c->n_expert >= 0) st = put_u32(c, "expert_count", c->n_expert);
  if (st == TSR_OK && c->n_expert_used >= 0) st = put_u32(c, "expert_used_count", c->n_expert_used);
  if (st == TSR_OK) st = put_u32(c, "attention.key_length", c->head_dim_full);
  if (st == TSR_OK) st = put_u32(c, "attention.value_length", c->head_dim_full);
  if (st == TSR_OK && c->softcap != 0) st = put_f32(c, "final_logit_softcapping", c->softcap);
  if (st == TSR_OK) st = put_u32(c, "attention.sliding_window", c->window);
  if (st == TSR_OK) st = put_u32(c, "attention.shared_kv_layers", c->n_kv_shared);
  if (st == TSR_OK) st = put_u32(c, "embedding_length_per_layer_input", c->n_embd_per_layer);
  if (st == TSR_OK) st = put_swa_pattern(c);
  if (st == TSR_OK) st = put_u32(c, "attention.key_length_swa", c->head_dim);
  if (st == TSR_OK) st = put_u32(c, "attention.value_length_swa", c->head_dim);
  if (st == TSR_OK && c->n_ff_exp >= 0) st = put_u32(c, "expert_feed_forward_length", c->n_ff_exp);
  /* full layers rotate "all" dims: rope_freqs marks the unrotated ones */
  if (st == TSR_OK) st = put_u32(c, "rope.dimension_count", c->head_dim_full);
  if (st == TSR_OK)
    st = put_u32(c, "rope.dimension_count_swa", (int64_t)((double)c->head_dim * c->rotary_swa));
  if (st == TSR_OK && c->assistant) {
    st = put_u32(c, "embedding_length_out", c->n_embd_backbone);
    if (st == TSR_OK) st = put_u32(c, "nextn_predict_layers", c->n_layer);
    if (st == TSR_OK && c->n_centroids)
      st = put_u32(c, "centroid_intermediate_top_k", c->centroid_top_k);
  }
  return st;
}

tsr_status gemma4_convert(void *ctx, const struct tsr_host *host, struct tsr_convert *cv) {
  (void)ctx;
  struct gemma4_cfg cfg = {.host = host, .cv = cv}; /* under 1 KB */
  struct gemma4_cfg *c = &cfg;
  const char *model_type;
  tsr_status st = host->convert->hf_str(cv, "model_type", &model_type);
  if (st != TSR_OK) return st;
  c->assistant = !strcmp(model_type, "gemma4_assistant");
  c->arch = c->assistant ? "gemma4-assistant" : "gemma4";
  /* Gemma4ForConditionalGeneration nests the decoder under language_model;
  ** Gemma4ForCausalLM and the assistant keep it under model. */
  c->prefix = host->convert->hf_tensor_has(cv, "model.language_model.embed_tokens.weight")
                  ? "model.language_model."
                  : "model.";
  st = read_config(c);
  if (st == TSR_OK) st = host->convert->out_str(cv, "general.architecture", c->arch);
  if (st == TSR_OK) st = write_metadata(c);
  /* llama.cpp writes tokenizer.ggml.model "gemma4" and no pre-tokenizer key;
  ** the host's tokenizer writer knows "gemma4" means that */
  if (st == TSR_OK) st = host->convert->tokenizer(cv, "gemma4");
  if (st == TSR_OK) st = gemma4_convert_tensors(c);
  return st;
}
