/*
** arch_qwen's converter: a Hugging Face Qwen checkpoint to GGUF exactly as
** llama.cpp's convert_hf_to_gguf.py writes it (architecture string, keys,
** tensor names, shapes and value transforms), so files interchange with
** llama.cpp both ways. tests/expected/ holds what llama.cpp wrote for each
** fixture; tests/test_convert.py compares against it.
**
**   model_type                      GGUF arch   tokenizer pre
**   qwen2                           qwen2       qwen2
**   qwen3                           qwen3       qwen2
**   qwen3_moe                       qwen3moe    qwen2
**   qwen3_5, qwen3_5_text           qwen35      qwen35
**   qwen3_5_moe, qwen3_5_moe_text   qwen35moe   qwen35
**
** Layout: an HF tensor of shape [a, b] (row-major) is the GGUF tensor
** ne {b, a} with the same values. The hybrids (qwen35, qwen35moe) also
** transform values:
**   - their RMSNorms are zero-centred, x̂·(1+w): the +1 is folded into every
**     norm except linear_attn.norm, which is a plain x̂·w already;
**   - ssm_a = -exp(A_log), so the runtime's decay is ssm_a·softplus(a + dt);
**   - conv1d [C, 1, K] drops its middle axis: ssm_conv1d {K, C};
**   - V heads move from HF's grouped order to tiled order;
**   - the MTP block (mtp.*) becomes block n_layer with blk.N.nextn.* names,
**     and block_count counts it.
** The vision tower (model.visual.*) is skipped: it belongs in an mmproj file.
** This file reads config.json and writes the keys; convert_qwen_tensors.c
** maps the tensors.
*/
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert_qwen_internal.h"

static const struct {
  const char *model_type;
  enum qwen_family family;
  const char *arch, *pre;
} g_types[] = {
    {"qwen2", QWEN2, "qwen2", "qwen2"},
    {"qwen3", QWEN3, "qwen3", "qwen2"},
    {"qwen3_moe", QWEN3MOE, "qwen3moe", "qwen2"},
    {"qwen3_5", QWEN35, "qwen35", "qwen35"},
    {"qwen3_5_text", QWEN35, "qwen35", "qwen35"},
    {"qwen3_5_moe", QWEN35MOE, "qwen35moe", "qwen35"},
    {"qwen3_5_moe_text", QWEN35MOE, "qwen35moe", "qwen35"},
};

const char *qfmt(char *out, const char *f, ...) {
  va_list ap;
  va_start(ap, f);
  vsnprintf(out, NAME_LEN, f, ap);
  va_end(ap);
  return out;
}

/* ---- config.json --------------------------------------------------------- */

/* The path of a text-model key. llama.cpp merges text_config over the top
** level, so text_config's copy wins; the first component decides, because a
** nested dict (rope_parameters) replaces the top-level one whole. */
static const char *cfg_path(const struct qc *q, const char *key, char *path) {
  if (q->text_config) {
    qfmt(path, "text_config.%.*s", (int)strcspn(key, "."), key);
    if (q->h->convert->hf_has(q->cv, path)) return qfmt(path, "text_config.%s", key);
  }
  return qfmt(path, "%s", key);
}

/* Resolves key into path; true when it holds a value (present, not null).
** A value of another type than the reader's (an object where a number
** belongs) is then the reader's error, never "absent". */
static bool cfg_where(const struct qc *q, const char *key, char *path) {
  cfg_path(q, key, path);
  return q->h->convert->hf_has(q->cv, path) != 0;
}

/* The optional readers: *found false when absent or null, an error for a
** value of another type. */
static tsr_status cfg_i64(const struct qc *q, const char *key, bool *found, int64_t *v) {
  char path[NAME_LEN];
  return (*found = cfg_where(q, key, path)) ? q->h->convert->hf_i64(q->cv, path, v) : TSR_OK;
}

static tsr_status cfg_f64(const struct qc *q, const char *key, bool *found, double *v) {
  char path[NAME_LEN];
  return (*found = cfg_where(q, key, path)) ? q->h->convert->hf_f64(q->cv, path, v) : TSR_OK;
}

static tsr_status cfg_str(const struct qc *q, const char *key, bool *found, const char **v) {
  char path[NAME_LEN];
  return (*found = cfg_where(q, key, path)) ? q->h->convert->hf_str(q->cv, path, v) : TSR_OK;
}

static tsr_status cfg_bool(const struct qc *q, const char *key, bool *found, bool *v) {
  char path[NAME_LEN];
  *v = false;
  return (*found = cfg_where(q, key, path)) ? q->h->convert->hf_bool(q->cv, path, v) : TSR_OK;
}

static tsr_status cfg_need_i64(const struct qc *q, const char *key, int64_t *v) {
  bool found;
  tsr_status st = cfg_i64(q, key, &found, v);
  if (st == TSR_OK && !found)
    st = q->h->set_error(TSR_ERR_FORMAT, "config.json has no %s%s (needed for %s)",
                         q->text_config ? "text_config." : "", key, q->arch);
  return st;
}

/* llama.cpp's find_hparam: the first of keys that is present. */
static tsr_status cfg_first_i64(const struct qc *q, const char *const *keys, bool *found,
                                int64_t *v) {
  *found = false;
  for (; *keys; keys++) {
    tsr_status st = cfg_i64(q, *keys, found, v);
    if (st != TSR_OK || *found) return st;
  }
  return TSR_OK;
}

static tsr_status cfg_first_f64(const struct qc *q, const char *const *keys, bool *found,
                                double *v) {
  *found = false;
  for (; *keys; keys++) {
    tsr_status st = cfg_f64(q, *keys, found, v);
    if (st != TSR_OK || *found) return st;
  }
  return TSR_OK;
}

/* ---- output keys ----------------------------------------------------------- */

static tsr_status put_u32(struct qc *q, const char *suffix, int64_t v) {
  char key[NAME_LEN];
  qfmt(key, "%s.%s", q->arch, suffix);
  if (v < 0 || v > (int64_t)UINT32_MAX)
    return q->h->set_error(TSR_ERR_FORMAT, "%s = %lld does not fit a u32", key, (long long)v);
  return q->h->convert->out_u32(q->cv, key, (uint32_t)v);
}

static tsr_status put_f32(struct qc *q, const char *suffix, double v) {
  char key[NAME_LEN];
  return q->h->convert->out_f32(q->cv, qfmt(key, "%s.%s", q->arch, suffix), (float)v);
}

static tsr_status put_str(struct qc *q, const char *suffix, const char *v) {
  char key[NAME_LEN];
  return q->h->convert->out_str(q->cv, qfmt(key, "%s.%s", q->arch, suffix), v);
}

/* Writes the first present of keys as a u32, as llama.cpp does. */
static tsr_status copy_u32(struct qc *q, const char *const *keys, const char *suffix) {
  bool found;
  int64_t v;
  tsr_status st = cfg_first_i64(q, keys, &found, &v);
  return st != TSR_OK || !found ? st : put_u32(q, suffix, v);
}

static tsr_status copy_f32(struct qc *q, const char *const *keys, const char *suffix) {
  bool found;
  double v;
  tsr_status st = cfg_first_f64(q, keys, &found, &v);
  return st != TSR_OK || !found ? st : put_f32(q, suffix, v);
}

/* copy_f32 for a key the runtime cannot do without (llama.cpp's converter
** would leave it out): absent is an error. */
static tsr_status need_f32(struct qc *q, const char *const *keys, const char *suffix) {
  bool found;
  double v;
  tsr_status st = cfg_first_f64(q, keys, &found, &v);
  if (st == TSR_OK && !found)
    st = q->h->set_error(TSR_ERR_FORMAT, "config.json has no %s; %s.%s needs it", keys[0],
                         q->arch, suffix);
  return st != TSR_OK ? st : put_f32(q, suffix, v);
}

/* ---- hyperparameters -------------------------------------------------------- */

static const char *const k_layers[] = {"n_layers", "num_hidden_layers", "n_layer", "num_layers",
                                       NULL};
static const char *const k_ctx[] = {"max_position_embeddings", "n_ctx", "n_positions",
                                    "max_length", "max_sequence_length", "model_max_length", NULL};
static const char *const k_embd[] = {"hidden_size", "n_embd", "dim", NULL};
static const char *const k_ff[] = {"prefix_dense_intermediate_size", "dense_intermediate_size",
                                   "intermediate_size", "n_inner", "hidden_dim", NULL};
static const char *const k_head[] = {"num_attention_heads", "n_head", "n_heads", NULL};
static const char *const k_head_kv[] = {"num_key_value_heads", "n_kv_heads", NULL};
static const char *const k_rms_eps[] = {"rms_norm_eps", "norm_eps", NULL};
static const char *const k_ln_eps[] = {"layer_norm_eps", "layer_norm_epsilon", "norm_epsilon",
                                       NULL};
static const char *const k_expert[] = {"num_local_experts", "num_experts", "n_routed_experts",
                                       NULL};
static const char *const k_expert_used[] = {"num_experts_per_tok", "num_experts_per_token",
                                            "top_k_experts", NULL};
static const char *const k_theta[] = {"global_rope_theta", "rope_global_theta",
                                      "rope_theta_global", "rope_theta", "rotary_emb_base", NULL};
static const char *const k_partial[] = {"partial_rotary_factor", "rope_pct", "rope_percent", NULL};

/* MTP blocks: the config's count, else the highest mtp.layers.N in the
** checkpoint (Qwen3-Next's configs do not state it). A checkpoint without
** any mtp.* tensor has none, whatever the config says: llama.cpp would
** count a block it then cannot load. */
static tsr_status count_mtp(struct qc *q) {
  bool found;
  int64_t n_cfg = 0, n_seen = 0;
  tsr_status st = cfg_i64(q, "mtp_num_hidden_layers", &found, &n_cfg);
  if (st != TSR_OK) return st;
  char prefix[NAME_LEN];
  size_t plen = strlen(qfmt(prefix, "%slayers.", q->mtp));
  bool any = false;
  for (int64_t i = 0; i < q->h->convert->hf_n_tensors(q->cv); i++) {
    const char *name = q->h->convert->hf_tensor_name(q->cv, i);
    if (!name || strncmp(name, q->mtp, strlen(q->mtp))) continue;
    any = true;
    if (!strncmp(name, prefix, plen)) {
      long idx = strtol(name + plen, NULL, 10);
      if (idx + 1 > n_seen) n_seen = idx + 1;
    }
  }
  q->n_mtp = !any ? 0 : n_cfg > 0 ? n_cfg : n_seen;
  return TSR_OK;
}

/* Which trunk layers are Gated DeltaNet: layer_types when the config has
** it (*listed), else every full_attention_interval-th layer is full. */
static tsr_status read_layer_kinds(struct qc *q, int64_t *interval, bool *listed) {
  bool found;
  tsr_status st = cfg_i64(q, "full_attention_interval", &found, interval);
  if (st != TSR_OK) return st;
  if (!found) *interval = 4;
  if (*interval < 1)
    return q->h->set_error(TSR_ERR_FORMAT, "config.json: full_attention_interval %lld",
                           (long long)*interval);
  if (!(q->linear = calloc((size_t)(q->n_layer + q->n_mtp), sizeof *q->linear)))
    return q->h->set_error(TSR_ERR_NOMEM, "out of memory");
  char path[NAME_LEN];
  if (!(*listed = cfg_where(q, "layer_types", path))) {
    for (int64_t i = 0; i < q->n_layer; i++) q->linear[i] = (i + 1) % *interval != 0;
    return TSR_OK;
  }
  int64_t n;
  if ((st = q->h->convert->hf_arr_len(q->cv, path, &n)) != TSR_OK) return st;
  if (n != q->n_layer)
    return q->h->set_error(TSR_ERR_FORMAT, "config.json: %s has %lld entries for %lld layers",
                           path, (long long)n, (long long)q->n_layer);
  for (int64_t i = 0; i < n; i++) {
    const char *kind;
    if ((st = q->h->convert->hf_arr_str(q->cv, path, i, &kind)) != TSR_OK) return st;
    if (strcmp(kind, "linear_attention") && strcmp(kind, "full_attention"))
      return q->h->set_error(TSR_ERR_UNSUPPORTED, "config.json: %s[%lld] is '%s' (%s has "
                             "linear_attention and full_attention layers)", path, (long long)i,
                             kind, q->arch);
    q->linear[i] = !strcmp(kind, "linear_attention");
    /* the runtime plans the layers from full_attention_interval alone */
    if (q->linear[i] != ((i + 1) % *interval != 0))
      return q->h->set_error(TSR_ERR_UNSUPPORTED, "config.json: %s[%lld] is %s, but "
                             "full_attention_interval %lld makes layer %lld %s; tessera runs "
                             "the pattern the interval gives", path, (long long)i, kind,
                             (long long)*interval, (long long)i,
                             q->linear[i] ? "full_attention" : "linear_attention");
  }
  return TSR_OK;
}

/* {arch}.attention.recurrent_layers: a bool per block, the MTP blocks false
** (q->linear has room for them). */
static tsr_status put_recurrent_layers(struct qc *q) {
  char key[NAME_LEN];
  qfmt(key, "%s.attention.recurrent_layers", q->arch);
  return q->h->convert->out_arr_bool(q->cv, key, q->linear, q->n_layer + q->n_mtp);
}

/* What the runtime's attention needs of the head layout: whole GQA groups,
** and an even head dim (RoPE turns pairs); head_dim, when the config gives
** none, is hidden_size / num_attention_heads, which must then divide. */
static tsr_status check_heads(const struct qc *q, bool has_head_dim) {
  if (q->n_head % q->n_head_kv)
    return q->h->set_error(TSR_ERR_FORMAT, "config.json: num_attention_heads %lld is not a "
                           "multiple of num_key_value_heads %lld (each KV head serves a whole "
                           "group of query heads)", (long long)q->n_head,
                           (long long)q->n_head_kv);
  if (!has_head_dim && q->n_embd % q->n_head)
    return q->h->set_error(TSR_ERR_FORMAT, "config.json has no head_dim, and hidden_size %lld "
                           "is not a multiple of num_attention_heads %lld", (long long)q->n_embd,
                           (long long)q->n_head);
  if (q->head_dim % 2)
    return q->h->set_error(TSR_ERR_FORMAT, "config.json: head_dim %lld%s is odd; RoPE rotates "
                           "pairs of dimensions", (long long)q->head_dim,
                           has_head_dim ? "" : " (hidden_size / num_attention_heads)");
  return TSR_OK;
}

static tsr_status read_hparams(struct qc *q) {
  bool found;
  tsr_status st = cfg_first_i64(q, k_layers, &found, &q->n_layer);
  if (st == TSR_OK && !found)
    st = q->h->set_error(TSR_ERR_FORMAT, "config.json has no num_hidden_layers");
  if (st == TSR_OK && (q->n_layer < 1 || q->n_layer > 4096))
    st = q->h->set_error(TSR_ERR_FORMAT, "config.json: %lld layers", (long long)q->n_layer);
  if (st == TSR_OK) st = cfg_need_i64(q, "hidden_size", &q->n_embd);
  if (st == TSR_OK) st = cfg_need_i64(q, "vocab_size", &q->n_vocab);
  if (st == TSR_OK) st = cfg_need_i64(q, "num_attention_heads", &q->n_head);
  if (st == TSR_OK) st = cfg_i64(q, "num_key_value_heads", &found, &q->n_head_kv);
  if (st == TSR_OK && !found) q->n_head_kv = q->n_head;
  bool has_head_dim = false, has_experts = false, has_used = false;
  int64_t n_used = 0;
  if (st == TSR_OK) st = cfg_i64(q, "head_dim", &has_head_dim, &q->head_dim);
  if (st == TSR_OK && !has_head_dim) q->head_dim = q->n_head ? q->n_embd / q->n_head : 0;
  if (st == TSR_OK) st = cfg_i64(q, "intermediate_size", &found, &q->n_ff);
  if (st == TSR_OK && !found) q->n_ff = -1; /* only checked where a dense FFN exists */
  if (st == TSR_OK) st = cfg_first_i64(q, k_expert, &has_experts, &q->n_expert);
  if (st == TSR_OK && !has_experts) q->n_expert = 0;
  if (st == TSR_OK) st = cfg_first_i64(q, k_expert_used, &has_used, &n_used);
  if (st == TSR_OK) st = cfg_i64(q, "moe_intermediate_size", &found, &q->n_ff_exp);
  if (st == TSR_OK && !found) q->n_ff_exp = -1;
  if (st == TSR_OK) st = cfg_i64(q, "shared_expert_intermediate_size", &found, &q->n_ff_shexp);
  if (st == TSR_OK && !found) q->n_ff_shexp = -1;
  if (st == TSR_OK) st = cfg_bool(q, "attention_bias", &found, &q->attn_bias);
  if (st != TSR_OK) return st;
  if (q->n_embd < 1 || q->n_vocab < 1 || q->n_head < 1 || q->n_head_kv < 1 || q->head_dim < 1)
    return q->h->set_error(TSR_ERR_FORMAT, "config.json: hidden_size %lld, vocab_size %lld, "
                           "heads %lld / %lld, head_dim %lld: all must be positive",
                           (long long)q->n_embd, (long long)q->n_vocab, (long long)q->n_head,
                           (long long)q->n_head_kv, (long long)q->head_dim);
  if (st == TSR_OK) st = check_heads(q, has_head_dim);
  /* the runtime reads expert_used_count wherever expert_count is written */
  if (st == TSR_OK && has_experts && !has_used)
    st = q->h->set_error(TSR_ERR_FORMAT, "config.json: %lld experts (num_experts) but no "
                         "num_experts_per_tok (how many of them each token uses)",
                         (long long)q->n_expert);
  if (st == TSR_OK && q->n_expert > 0 && (n_used < 1 || n_used > q->n_expert))
    st = q->h->set_error(TSR_ERR_FORMAT, "config.json: num_experts_per_tok is %lld; expected "
                         "1 to num_experts (%lld)", (long long)n_used, (long long)q->n_expert);
  if (st != TSR_OK || !q->hybrid) return st;

  st = cfg_need_i64(q, "linear_num_key_heads", &q->hk);
  if (st == TSR_OK) st = cfg_need_i64(q, "linear_num_value_heads", &q->hv);
  if (st == TSR_OK) st = cfg_need_i64(q, "linear_key_head_dim", &q->dk);
  if (st == TSR_OK) st = cfg_need_i64(q, "linear_value_head_dim", &q->dv);
  if (st == TSR_OK) st = cfg_need_i64(q, "linear_conv_kernel_dim", &q->conv_k);
  if (st != TSR_OK) return st;
  if (q->hk < 1 || q->hv < 1 || q->hv % q->hk || q->dk < 1 || q->dv < 1 || q->conv_k < 1)
    return q->h->set_error(TSR_ERR_FORMAT, "config.json: linear attention with %lld key heads, "
                           "%lld value heads (a multiple is needed), dims %lld / %lld, conv %lld",
                           (long long)q->hk, (long long)q->hv, (long long)q->dk,
                           (long long)q->dv, (long long)q->conv_k);
  return count_mtp(q);
}

/* ---- metadata ---------------------------------------------------------------- */

/* The RoPE dict: rope_parameters (transformers 5), else rope_scaling. */
static const char *rope_dict(const struct qc *q) {
  char path[NAME_LEN];
  return q->h->convert->hf_has(q->cv, cfg_path(q, "rope_parameters", path)) ? "rope_parameters"
                                                                            : "rope_scaling";
}

/* RoPE keys from rope_parameters (transformers 5) or rope_scaling (older),
** with the top-level rope_theta / partial_rotary_factor mirrored in when the
** dict lacks them, as llama.cpp does. */
static tsr_status write_rope(struct qc *q) {
  char path[NAME_LEN], key[NAME_LEN];
  const char *rp = rope_dict(q);
  bool found, has_factor;
  const char *type = NULL;
  double factor = 0, v;
  tsr_status st = cfg_str(q, qfmt(key, "%s.rope_type", rp), &found, &type);
  if (st == TSR_OK && !found) st = cfg_str(q, qfmt(key, "%s.type", rp), &found, &type);
  if (st == TSR_OK) st = cfg_f64(q, qfmt(key, "%s.factor", rp), &has_factor, &factor);
  if (st != TSR_OK) return st;
  bool scaled = type && has_factor && (!strcmp(type, "linear") || !strcmp(type, "yarn"));
  bool longrope = type && (!strcmp(type, "su") || !strcmp(type, "longrope"));
  if (type && !scaled && !longrope && strcmp(type, "default"))
    /* llama.cpp writes nothing for other types (and warns); dropping a
    ** scaling rule silently would change the model, so refuse instead */
    return q->h->set_error(TSR_ERR_UNSUPPORTED, "config.json: %s.rope_type '%s'%s is not "
                           "converted (default, linear, yarn and longrope are)", rp, type,
                           has_factor ? "" : " without a factor");
  if (scaled) {
    st = put_str(q, "rope.scaling.type", type);
    if (st == TSR_OK) st = put_f32(q, "rope.scaling.factor", factor);
    if (st == TSR_OK && !strcmp(type, "yarn")) {
      int64_t orig;
      st = cfg_need_i64(q, qfmt(key, "%s.original_max_position_embeddings", rp), &orig);
      if (st == TSR_OK) st = put_u32(q, "rope.scaling.original_context_length", orig);
      static const char *const yarn[][2] = {{"extrapolation_factor", "yarn_ext_factor"},
                                            {"attention_factor", "yarn_attn_factor"},
                                            {"attn_factor", "yarn_attn_factor"},
                                            {"beta_fast", "yarn_beta_fast"},
                                            {"beta_slow", "yarn_beta_slow"}};
      bool attn_done = false;
      for (size_t i = 0; i < sizeof yarn / sizeof yarn[0] && st == TSR_OK; i++) {
        bool is_attn = !strcmp(yarn[i][1], "yarn_attn_factor");
        if (is_attn && attn_done) continue;
        st = cfg_f64(q, qfmt(key, "%s.%s", rp, yarn[i][0]), &found, &v);
        if (st == TSR_OK && found) {
          attn_done |= is_attn;
          st = put_f32(q, qfmt(path, "rope.scaling.%s", yarn[i][1]), v);
        }
      }
    }
  } else if (longrope) {
    st = put_str(q, "rope.scaling.type", "longrope");
  }
  if (st != TSR_OK) return st;

  int64_t n_sec;
  if (cfg_where(q, qfmt(key, "%s.mrope_section", rp), path)) {
    /* padded to [time, height, width, extra] */
    int32_t sec[4] = {0, 0, 0, 0};
    st = q->h->convert->hf_arr_len(q->cv, path, &n_sec);
    if (st == TSR_OK && n_sec > 4)
      st = q->h->set_error(TSR_ERR_FORMAT, "config.json: %s has %lld sections; at most 4 "
                           "(time, height, width, extra)", path, (long long)n_sec);
    for (int64_t i = 0; i < n_sec && i < 4 && st == TSR_OK; i++) {
      int64_t s;
      st = q->h->convert->hf_arr_i64(q->cv, path, i, &s);
      sec[i] = (int32_t)s;
    }
    if (st == TSR_OK)
      st = q->h->convert->out_arr_i32(q->cv, qfmt(key, "%s.rope.dimension_sections", q->arch), sec,
                                      4);
  } else if (q->hybrid) {
    /* Qwen3.5 always applies interleaved M-RoPE; llama.cpp requires the key */
    static const int32_t sec[4] = {11, 11, 10, 0};
    st =
        q->h->convert->out_arr_i32(q->cv, qfmt(key, "%s.rope.dimension_sections", q->arch), sec, 4);
  }
  if (st != TSR_OK) return st;

  st = cfg_f64(q, qfmt(key, "%s.rope_theta", rp), &found, &v);
  if (st == TSR_OK && !found) st = cfg_first_f64(q, k_theta, &found, &v);
  /* llama.cpp leaves the key out (its loader has a default); tessera's runtime needs it */
  if (st == TSR_OK && !found)
    st = q->h->set_error(TSR_ERR_FORMAT, "config.json has no rope_theta (neither in %s nor at "
                         "the top level); %s.rope.freq_base needs it", rp, q->arch);
  if (st == TSR_OK) st = put_f32(q, "rope.freq_base", v);
  return st;
}

/* The keys of the hybrids: Gated DeltaNet sizes, layer pattern, partial RoPE. */
static tsr_status write_hybrid_keys(struct qc *q) {
  tsr_status st = TSR_OK;
  if (q->n_mtp > 0) st = put_u32(q, "nextn_predict_layers", q->n_mtp);
  if (st == TSR_OK) st = put_u32(q, "ssm.conv_kernel", q->conv_k);
  if (st == TSR_OK) st = put_u32(q, "ssm.state_size", q->dk);
  if (st == TSR_OK) st = put_u32(q, "ssm.group_count", q->hk);
  if (st == TSR_OK) st = put_u32(q, "ssm.time_step_rank", q->hv);
  if (st == TSR_OK) st = put_u32(q, "ssm.inner_size", q->dv * q->hv);
  int64_t interval = 4;
  bool listed = false;
  if (st == TSR_OK) st = read_layer_kinds(q, &interval, &listed);
  /* llama.cpp writes the per-block list only where the config has one */
  if (st == TSR_OK && listed) st = put_recurrent_layers(q);
  if (st == TSR_OK) st = put_u32(q, "full_attention_interval", interval);
  if (st != TSR_OK) return st;
  bool found;
  char path[NAME_LEN];
  double partial;
  st = cfg_f64(q, qfmt(path, "%s.partial_rotary_factor", rope_dict(q)), &found, &partial);
  if (st == TSR_OK && !found) st = cfg_first_f64(q, k_partial, &found, &partial);
  if (st == TSR_OK && !found) partial = 0.25;
  int64_t n_rot = (int64_t)((double)q->head_dim * partial);
  if (st == TSR_OK && (n_rot < 2 || n_rot % 2 || n_rot > q->head_dim))
    st = q->h->set_error(TSR_ERR_FORMAT, "config.json: partial_rotary_factor %g of head_dim "
                         "%lld rotates %lld dimensions; RoPE needs an even count from 2 to "
                         "head_dim", partial, (long long)q->head_dim, (long long)n_rot);
  if (st == TSR_OK) st = put_u32(q, "rope.dimension_count", n_rot);
  return st;
}

static tsr_status write_keys(struct qc *q) {
  char key[NAME_LEN];
  tsr_status st = q->h->convert->out_str(q->cv, "general.architecture", q->arch);
  if (st == TSR_OK) st = put_u32(q, "block_count", q->n_layer + q->n_mtp);
  if (st == TSR_OK) st = copy_u32(q, k_ctx, "context_length");
  if (st == TSR_OK) st = copy_u32(q, k_embd, "embedding_length");
  if (st == TSR_OK) st = copy_u32(q, k_ff, "feed_forward_length");
  if (st == TSR_OK) st = copy_u32(q, k_head, "attention.head_count");
  if (st == TSR_OK) st = copy_u32(q, k_head_kv, "attention.head_count_kv");
  if (st == TSR_OK) st = write_rope(q);
  if (st == TSR_OK) st = need_f32(q, k_rms_eps, "attention.layer_norm_rms_epsilon");
  if (st == TSR_OK) st = copy_f32(q, k_ln_eps, "attention.layer_norm_epsilon");
  if (st == TSR_OK) st = copy_u32(q, k_expert, "expert_count");
  if (st == TSR_OK) st = copy_u32(q, k_expert_used, "expert_used_count");
  bool found;
  int64_t v;
  /* key_length / value_length only where the config states head_dim */
  if (st == TSR_OK) st = cfg_i64(q, "head_dim", &found, &v);
  if (st == TSR_OK && found) st = put_u32(q, "attention.key_length", v);
  if (st == TSR_OK && found) st = put_u32(q, "attention.value_length", v);
  if (st == TSR_OK && q->family != QWEN2 && q->family != QWEN3) {
    static const char *const k_ff_exp[] = {"moe_intermediate_size", NULL};
    static const char *const k_ff_shexp[] = {"shared_expert_intermediate_size", NULL};
    st = copy_u32(q, k_ff_exp, "expert_feed_forward_length");
    if (st == TSR_OK) st = copy_u32(q, k_ff_shexp, "expert_shared_feed_forward_length");
  }
  if (st == TSR_OK && q->family == QWEN3MOE) {
    /* llama.cpp hard-codes renormalised top-k for qwen3moe and writes no
    ** key. A model trained without it (norm_topk_prob false) would then run
    ** wrong, so that case (only) says so with llama.cpp's own key. */
    bool norm;
    st = cfg_bool(q, "norm_topk_prob", &found, &norm);
    if (st == TSR_OK && found && !norm)
      st = q->h->convert->out_bool(q->cv, qfmt(key, "%s.expert_weights_norm", q->arch), false);
  }
  if (st == TSR_OK && q->hybrid) st = write_hybrid_keys(q);
  return st;
}

/* ---- entry ---------------------------------------------------------------------- */

static tsr_status check_tied(const struct qc *q) {
  bool found, tied;
  tsr_status st = cfg_bool(q, "tie_word_embeddings", &found, &tied);
  if (st == TSR_OK && found && !tied)
    st = q->h->set_error(TSR_ERR_FORMAT, "config.json says tie_word_embeddings false, but the "
                         "checkpoint has no lm_head.weight");
  return st;
}

tsr_status qwen_convert(void *ctx, const struct tsr_host *host, struct tsr_convert *cv) {
  (void)ctx;
  const char *model_type;
  tsr_status st = host->convert->hf_str(cv, "model_type", &model_type);
  if (st != TSR_OK) return st;
  struct qc q = {.h = host, .cv = cv};
  const char *pre = NULL;
  for (size_t i = 0; i < sizeof g_types / sizeof g_types[0]; i++)
    if (!strcmp(model_type, g_types[i].model_type)) {
      q.family = g_types[i].family;
      q.arch = g_types[i].arch;
      pre = g_types[i].pre;
    }
  if (!q.arch)
    return host->set_error(TSR_ERR_UNSUPPORTED, "arch_qwen converts model_type %s, not '%s'",
                           QWEN_HF_TYPES, model_type);
  q.hybrid = q.family == QWEN35 || q.family == QWEN35MOE;
  q.text_config = host->convert->hf_has(cv, "text_config") != 0;
  q.tp = host->convert->hf_tensor_has(cv, "model.language_model.embed_tokens.weight")
             ? "model.language_model."
             : "model.";
  q.mtp = host->convert->hf_tensor_has(cv, "model.mtp.fc.weight") ? "model.mtp." : "mtp.";
  host->convert->hf_skip_prefix(cv, "model.visual.");

  st = read_hparams(&q);
  if (st == TSR_OK) st = write_keys(&q);
  if (st == TSR_OK) st = host->convert->tokenizer(cv, pre);
  if (st == TSR_OK) st = qwen_write_tensors(&q);
  /* tied embeddings: no output tensor (llama.cpp reuses token_embd); a
  ** config that says untied must come with its lm_head */
  if (st == TSR_OK && !host->convert->hf_tensor_has(cv, "lm_head.weight")) st = check_tied(&q);
  free(q.linear);
  return st;
}
