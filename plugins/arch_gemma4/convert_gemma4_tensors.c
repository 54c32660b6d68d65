/*
** Gemma 4 tensors: Hugging Face names and shapes -> llama.cpp's GGUF names
** (gguf-py's tensor map for MODEL_ARCH.GEMMA4 / GEMMA4_ASSISTANT), values
** unchanged: Gemma 4's RMSNorm multiplies by w itself (llama.cpp's
** norm_shift is 0 here, unlike Gemma 2/3's 1 + w), and the fused MoE
** tensors keep their layout ([E, 2I, H] gate rows first, read as GGUF
** ne {H, 2I, E}). The one derived tensor is rope_freqs.
**
** Every tensor's shape is checked against config.json before it is read,
** so a checkpoint that does not fit its config fails naming the tensor.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert_gemma4.h"

#define NAME_LEN 192

enum presence { REQUIRED, OPTIONAL };

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

/* What llama.cpp's converter stores in the --outtype; the rest stays f32:
** 1-D tensors, norms, names not ending in .weight, and the MoE router
** (ffn_gate_inp), as llama.cpp's quantizer also keeps it. */
static bool quantizable(const char *gguf_name, int32_t n_dims) {
  return n_dims >= 2 && ends_with(gguf_name, ".weight") && !ends_with(gguf_name, "_norm.weight") &&
         !ends_with(gguf_name, "ffn_gate_inp.weight");
}

static void shape_str(char *buf, size_t size, int32_t nd, const int64_t *shape) {
  int n = snprintf(buf, size, "[");
  for (int32_t i = 0; i < nd && n > 0 && (size_t)n < size; i++)
    n += snprintf(buf + n, size - (size_t)n, i ? ", %lld" : "%lld", (long long)shape[i]);
  if (n > 0 && (size_t)n < size) snprintf(buf + n, size - (size_t)n, "]");
}

/* Reads checkpoint tensor `hf` (shape `want`, outermost first, as
** config.json implies it) and writes it as `gguf` with ne reversed. */
static tsr_status put(struct gemma4_cfg *c, enum presence p, const char *hf, const char *gguf,
                      int32_t nd, const int64_t *want) {
  const struct tsr_host *h = c->host;
  if (!h->convert->hf_tensor_has(c->cv, hf)) {
    if (p == OPTIONAL) return TSR_OK;
    return h->set_error(TSR_ERR_FORMAT, "checkpoint has no tensor %s (needed for %s)", hf, gguf);
  }
  int32_t have_nd;
  int64_t have[4];
  tsr_status st = h->convert->hf_tensor_shape(c->cv, hf, &have_nd, have);
  if (st != TSR_OK) return st;
  bool same = have_nd == nd;
  for (int32_t i = 0; same && i < nd; i++) same = have[i] == want[i];
  if (!same) {
    char a[96], b[96];
    shape_str(a, sizeof a, have_nd, have);
    shape_str(b, sizeof b, nd, want);
    return h->set_error(TSR_ERR_FORMAT, "checkpoint tensor %s has shape %s; config.json implies %s",
                        hf, a, b);
  }
  int64_t n = 1, ne[4];
  for (int32_t i = 0; i < nd; i++) {
    n *= want[i];
    ne[i] = want[nd - 1 - i];
  }
  float *buf = malloc((size_t)n * sizeof *buf);
  if (!buf)
    return h->set_error(TSR_ERR_NOMEM, "out of memory reading %s (%lld values)", hf, (long long)n);
  st = h->convert->hf_tensor_read(c->cv, hf, buf, n);
  if (st == TSR_OK) st = h->convert->out_tensor(c->cv, gguf, quantizable(gguf, nd), nd, ne, buf);
  free(buf);
  return st;
}

/* One decoder tensor of layer l: HF "<prefix>layers.<l>.<hf>" -> "blk.<l>.<gguf>". */
static tsr_status put_layer(struct gemma4_cfg *c, enum presence p, int64_t l, const char *hf,
                            const char *gguf, int32_t nd, const int64_t *want) {
  char hf_name[NAME_LEN], gguf_name[NAME_LEN];
  snprintf(hf_name, sizeof hf_name, "%slayers.%lld.%s", c->prefix, (long long)l, hf);
  snprintf(gguf_name, sizeof gguf_name, "blk.%lld.%s", (long long)l, gguf);
  return put(c, p, hf_name, gguf_name, nd, want);
}

/* Gemma 4's full layers use "proportional" RoPE: only the first
** rotary_full * head_dim / 2 frequency pairs turn, at the frequencies of the
** whole head dim. llama.cpp keeps NeoX rope over all dims and divides the
** other pairs' angles by 1e30 (so they stay put); this tensor holds those
** divisors and is read by full layers only. */
static tsr_status put_rope_freqs(struct gemma4_cfg *c) {
  const int64_t n_pairs = c->head_dim_full / 2;
  const int64_t n_rot = (int64_t)((double)c->head_dim_full * c->rotary_full / 2.0);
  float *f = malloc((size_t)n_pairs * sizeof *f);
  if (!f) return c->host->set_error(TSR_ERR_NOMEM, "out of memory");
  for (int64_t i = 0; i < n_pairs; i++) f[i] = i < n_rot ? 1.0f : 1e30f;
  tsr_status st = c->host->convert->out_tensor(c->cv, "rope_freqs.weight", false, 1, &n_pairs, f);
  free(f);
  return st;
}

static tsr_status put_attention(struct gemma4_cfg *c, int64_t l) {
  const int64_t H = c->n_embd, hd = gemma4_layer_head_dim(c, l);
  const int64_t q_width = c->n_head * hd, kv_width = gemma4_layer_kv_heads(c, l) * hd;
  const bool shared = l >= gemma4_first_shared(c);
  /* a shared layer computes no K/V (the assistant's checkpoints have none,
  ** and llama.cpp's assistant map has no names for them); a model's shared
  ** layer that still carries k/v weights gets them converted, as llama.cpp does */
  const enum presence kv = shared ? OPTIONAL : REQUIRED;
  /* k_eq_v full layers take V from the raw K projection: no v_proj */
  const enum presence v = shared || (c->k_eq_v && !c->swa[l]) ? OPTIONAL : REQUIRED;
  tsr_status st = put_layer(c, REQUIRED, l, "input_layernorm.weight", "attn_norm.weight", 1,
                            (int64_t[]){H});
  if (st == TSR_OK)
    st = put_layer(c, REQUIRED, l, "self_attn.q_proj.weight", "attn_q.weight", 2,
                   (int64_t[]){q_width, H});
  if (st == TSR_OK)
    st = put_layer(c, REQUIRED, l, "self_attn.q_norm.weight", "attn_q_norm.weight", 1,
                   (int64_t[]){hd});
  if (st == TSR_OK && !c->assistant) {
    st = put_layer(c, kv, l, "self_attn.k_proj.weight", "attn_k.weight", 2,
                   (int64_t[]){kv_width, H});
    if (st == TSR_OK)
      st = put_layer(c, kv, l, "self_attn.k_norm.weight", "attn_k_norm.weight", 1,
                     (int64_t[]){hd});
    if (st == TSR_OK)
      st = put_layer(c, v, l, "self_attn.v_proj.weight", "attn_v.weight", 2,
                     (int64_t[]){kv_width, H});
  }
  if (st == TSR_OK)
    st = put_layer(c, REQUIRED, l, "self_attn.o_proj.weight", "attn_output.weight", 2,
                   (int64_t[]){H, q_width});
  if (st == TSR_OK)
    st = put_layer(c, REQUIRED, l, "post_attention_layernorm.weight", "post_attention_norm.weight",
                   1, (int64_t[]){H});
  return st;
}

static tsr_status put_mlp(struct gemma4_cfg *c, int64_t l) {
  const int64_t H = c->n_embd, ff = gemma4_layer_ff(c, l);
  tsr_status st = put_layer(c, REQUIRED, l, "pre_feedforward_layernorm.weight", "ffn_norm.weight",
                            1, (int64_t[]){H});
  if (st == TSR_OK)
    st = put_layer(c, REQUIRED, l, "mlp.gate_proj.weight", "ffn_gate.weight", 2,
                   (int64_t[]){ff, H});
  if (st == TSR_OK)
    st = put_layer(c, REQUIRED, l, "mlp.up_proj.weight", "ffn_up.weight", 2, (int64_t[]){ff, H});
  if (st == TSR_OK)
    st = put_layer(c, REQUIRED, l, "mlp.down_proj.weight", "ffn_down.weight", 2,
                   (int64_t[]){H, ff});
  if (st == TSR_OK)
    st = put_layer(c, REQUIRED, l, "post_feedforward_layernorm.weight", "post_ffw_norm.weight", 1,
                   (int64_t[]){H});
  return st;
}

/* The MoE block beside the dense MLP: its own norms, the router (with its
** input scale and the per-expert output scale) and the fused experts. */
static tsr_status put_moe(struct gemma4_cfg *c, int64_t l) {
  const int64_t H = c->n_embd, E = c->n_expert, I = c->n_ff_exp;
  static const char *const norms[][2] = {
      {"post_feedforward_layernorm_1.weight", "post_ffw_norm_1.weight"},
      {"pre_feedforward_layernorm_2.weight", "pre_ffw_norm_2.weight"},
      {"post_feedforward_layernorm_2.weight", "post_ffw_norm_2.weight"},
  };
  tsr_status st = TSR_OK;
  for (int i = 0; i < 3 && st == TSR_OK; i++)
    st = put_layer(c, REQUIRED, l, norms[i][0], norms[i][1], 1, (int64_t[]){H});
  if (st == TSR_OK)
    st = put_layer(c, REQUIRED, l, "router.proj.weight", "ffn_gate_inp.weight", 2,
                   (int64_t[]){E, H});
  if (st == TSR_OK)
    st = put_layer(c, REQUIRED, l, "router.scale", "ffn_gate_inp.scale", 1, (int64_t[]){H});
  if (st == TSR_OK)
    st = put_layer(c, REQUIRED, l, "router.per_expert_scale", "ffn_down_exps.scale", 1,
                   (int64_t[]){E});
  if (st == TSR_OK)
    st = put_layer(c, REQUIRED, l, "experts.gate_up_proj", "ffn_gate_up_exps.weight", 3,
                   (int64_t[]){E, 2 * I, H});
  if (st == TSR_OK)
    st = put_layer(c, REQUIRED, l, "experts.down_proj", "ffn_down_exps.weight", 3,
                   (int64_t[]){E, H, I});
  return st;
}

/* Per-layer input (E2B/E4B): gate from the residual, projection back, norm. */
static tsr_status put_per_layer_input(struct gemma4_cfg *c, int64_t l) {
  const int64_t H = c->n_embd, P = c->n_embd_per_layer;
  tsr_status st = put_layer(c, REQUIRED, l, "per_layer_input_gate.weight", "inp_gate.weight", 2,
                            (int64_t[]){P, H});
  if (st == TSR_OK)
    st = put_layer(c, REQUIRED, l, "per_layer_projection.weight", "proj.weight", 2,
                   (int64_t[]){H, P});
  if (st == TSR_OK)
    st = put_layer(c, REQUIRED, l, "post_per_layer_input_norm.weight", "post_norm.weight", 1,
                   (int64_t[]){H});
  return st;
}

/* The assistant's ordered embeddings: cluster centroids (kept f32: they pick
** which clusters get real logits, a choice rounding must not flip) and the
** token ordering (i32: vocab_size token ids, cluster after cluster). */
static tsr_status put_ordered_embeddings(struct gemma4_cfg *c) {
  const struct tsr_host *h = c->host;
  const int64_t H = c->n_embd, C = c->n_centroids, V = c->vocab;
  int32_t nd;
  int64_t shape[4];
  tsr_status st =
      h->convert->hf_tensor_shape(c->cv, "masked_embedding.centroids.weight", &nd, shape);
  if (st == TSR_OK && (nd != 2 || shape[0] != C || shape[1] != H))
    st = h->set_error(TSR_ERR_FORMAT, "masked_embedding.centroids.weight is not [%lld, %lld]",
                      (long long)C, (long long)H);
  if (st == TSR_OK)
    st = h->convert->hf_tensor_shape(c->cv, "masked_embedding.token_ordering", &nd, shape);
  if (st == TSR_OK && (nd != 1 || shape[0] != V))
    st = h->set_error(TSR_ERR_FORMAT, "masked_embedding.token_ordering is not [%lld]",
                      (long long)V);
  float *buf = st == TSR_OK ? malloc((size_t)(C * H > V ? C * H : V) * sizeof *buf) : NULL;
  int32_t *ids = st == TSR_OK ? malloc((size_t)V * sizeof *ids) : NULL;
  if (st == TSR_OK && (!buf || !ids)) st = h->set_error(TSR_ERR_NOMEM, "out of memory");
  if (st == TSR_OK)
    st = h->convert->hf_tensor_read(c->cv, "masked_embedding.centroids.weight", buf, C * H);
  if (st == TSR_OK)
    st = h->convert->out_tensor(c->cv, "masked_embd_centroids.weight", false, 2, (int64_t[]){H, C},
                                buf);
  if (st == TSR_OK)
    st = h->convert->hf_tensor_read(c->cv, "masked_embedding.token_ordering", buf, V);
  for (int64_t i = 0; st == TSR_OK && i < V; i++) {
    if (!(buf[i] >= 0 && buf[i] < (float)V && buf[i] == (float)(int32_t)buf[i]))
      st = h->set_error(TSR_ERR_FORMAT, "masked_embedding.token_ordering[%lld] = %g is not a "
                        "token id below %lld", (long long)i, buf[i], (long long)V);
    else
      ids[i] = (int32_t)buf[i];
  }
  if (st == TSR_OK) st = h->convert->out_tensor_i32(c->cv, "masked_embd_ordering", 1, &V, ids);
  free(buf);
  free(ids);
  return st;
}

static tsr_status put_globals(struct gemma4_cfg *c) {
  const int64_t H = c->n_embd, V = c->vocab;
  char hf[NAME_LEN];
  snprintf(hf, sizeof hf, "%sembed_tokens.weight", c->prefix);
  tsr_status st = put(c, REQUIRED, hf, "token_embd.weight", 2, (int64_t[]){V, H});
  if (st == TSR_OK && !c->assistant && c->n_embd_per_layer > 0) {
    const int64_t P = c->n_embd_per_layer, LP = c->n_layer * P;
    snprintf(hf, sizeof hf, "%sembed_tokens_per_layer.weight", c->prefix);
    st = put(c, REQUIRED, hf, "per_layer_token_embd.weight", 2,
             (int64_t[]){c->vocab_per_layer, LP});
    snprintf(hf, sizeof hf, "%sper_layer_model_projection.weight", c->prefix);
    if (st == TSR_OK)
      st = put(c, REQUIRED, hf, "per_layer_model_proj.weight", 2, (int64_t[]){LP, H});
    snprintf(hf, sizeof hf, "%sper_layer_projection_norm.weight", c->prefix);
    if (st == TSR_OK) st = put(c, REQUIRED, hf, "per_layer_proj_norm.weight", 1, (int64_t[]){P});
  }
  snprintf(hf, sizeof hf, "%snorm.weight", c->prefix);
  if (st == TSR_OK) st = put(c, REQUIRED, hf, "output_norm.weight", 1, (int64_t[]){H});
  /* tied in every released Gemma 4; an untied head is llama.cpp's `output` */
  if (st == TSR_OK && !c->assistant)
    st = put(c, OPTIONAL, "lm_head.weight", "output.weight", 2, (int64_t[]){V, H});
  if (st == TSR_OK && c->assistant) {
    const int64_t Ht = c->n_embd_backbone;
    st = put(c, REQUIRED, "pre_projection.weight", "nextn.pre_projection.weight", 2,
             (int64_t[]){H, 2 * Ht});
    if (st == TSR_OK)
      st = put(c, REQUIRED, "post_projection.weight", "nextn.post_projection.weight", 2,
               (int64_t[]){Ht, H});
    if (st == TSR_OK && c->n_centroids) st = put_ordered_embeddings(c);
  }
  return st;
}

tsr_status gemma4_convert_tensors(struct gemma4_cfg *c) {
  const struct tsr_host *h = c->host;
  if (c->assistant && !c->n_centroids) {
    h->convert->hf_skip_prefix(c->cv, "masked_embedding."); /* unused without ordered embeddings */
  } else if (c->assistant) {
    /* kept, unlike llama.cpp's converter (README), under the names its loader accepts */
  } else if (!strcmp(c->prefix, "model.language_model.")) {
    /* the multimodal towers go to llama.cpp's separate mmproj file */
    static const char *const towers[] = {"model.vision_tower.", "model.embed_vision.",
                                         "model.audio_tower.", "model.embed_audio."};
    for (size_t i = 0; i < sizeof towers / sizeof towers[0]; i++)
      h->convert->hf_skip_prefix(c->cv, towers[i]);
  }
  tsr_status st = put_rope_freqs(c);
  if (st == TSR_OK) st = put_globals(c);
  for (int64_t l = 0; l < c->n_layer && st == TSR_OK; l++) {
    st = put_attention(c, l);
    if (st == TSR_OK) st = put_mlp(c, l);
    if (st == TSR_OK && c->moe && !c->assistant) st = put_moe(c, l);
    if (st == TSR_OK && c->n_embd_per_layer > 0 && !c->assistant) st = put_per_layer_input(c, l);
    if (st == TSR_OK)
      st = put_layer(c, REQUIRED, l, "layer_scalar", "layer_output_scale.weight", 1,
                     (int64_t[]){1});
  }
  return st;
}
