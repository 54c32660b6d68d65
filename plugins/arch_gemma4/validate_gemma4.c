/*
** arch_gemma4's validate(): a Gemma 3 / Gemma 4 GGUF's hyperparameters
** against its tensors, at load, with the layer plan describe() made (each
** layer's kind, heads, head dims and KV source):
**
**   token_embd.weight   [embedding_length, V]; V = tokenizer.ggml.tokens' count
**   output.weight       [embedding_length, V] when present (else tied)
**   attention           attn_q [E, H*Dk], attn_output [H*Dv, E], q norm [Dk]; a
**                       layer that owns its K/V: attn_k [E, Hkv*Dk], k norm [Dk]
**                       and attn_v [E, Hkv*Dv] (Gemma 4's k_eq_v full layers have
**                       none: in every owning layer of a kind or in none)
**   MLP                 ffn_gate/up [E, F], ffn_down [F, E]; F is
**                       feed_forward_length, one value or one per layer
**   experts (Gemma 4)   ffn_gate_inp [E, expert_count] in every layer or none,
**                       ffn_gate_up_exps [E, 2 x expert_feed_forward_length, n],
**                       ffn_down_exps [F', E, n], their scales
**   per-layer inputs    embedding_length_per_layer_input P > 0 needs
**   (E2B/E4B)           per_layer_token_embd [P x layers, V] and each layer's
**                       inp_gate [E, P], proj [P, E]
**   rope_freqs.weight   [rope.dimension_count / 2] when present
**   the assistant       nextn.pre_projection [2 x embedding_length_out, E],
**                       nextn.post_projection [E, embedding_length_out]
** and the float keys the forward passes read are finite and positive.
*/
#include <stdio.h>
#include <string.h>

#include "gemma4.h"

struct gcheck {
  const struct tsr_host *h;
  const struct tsr_gguf *m;
  const char *arch;
  bool gemma3, assistant;
  int64_t n_embd, n_vocab;
  char k_embd[96];
};

static const char *key_of(char *buf, size_t cap, const char *arch, const char *suffix) {
  snprintf(buf, cap, "%s.%s", arch, suffix);
  return buf;
}

static tsr_status opt_u32(const struct gcheck *c, const char *suffix, int64_t dflt, int64_t *out) {
  char key[128];
  uint32_t v;
  *out = dflt;
  if (!c->h->gguf->has_key(c->m, key_of(key, sizeof key, c->arch, suffix))) return TSR_OK;
  tsr_status st = c->h->gguf->get_u32(c->m, key, &v);
  if (st == TSR_OK) *out = v;
  return st;
}

static tsr_status positive(const struct gcheck *c, const char *suffix) {
  char key[128];
  float v;
  if (!c->h->gguf->has_key(c->m, key_of(key, sizeof key, c->arch, suffix))) return TSR_OK;
  return c->h->gguf->f32_positive(c->m, key, &v);
}

static tsr_status tensor(const struct gcheck *c, const char *name, int n_dims, const int64_t *ne,
                         const char *const *why) {
  return c->h->gguf->check_weight(c->m, name, n_dims, ne, why);
}

static tsr_status layer_tensor(const struct gcheck *c, int il, const char *suffix, int n_dims,
                               const int64_t *ne, const char *const *why) {
  char name[128];
  snprintf(name, sizeof name, "blk.%d.%s", il, suffix);
  return tensor(c, name, n_dims, ne, why);
}

static tsr_status embd_vector(const struct gcheck *c, int il, const char *suffix) {
  return layer_tensor(c, il, suffix, 1, (int64_t[]){c->n_embd}, (const char *[]){c->k_embd});
}

static tsr_status from_embd(const struct gcheck *c, int il, const char *suffix, int64_t out,
                            const char *why_out) {
  return layer_tensor(c, il, suffix, 2, (int64_t[]){c->n_embd, out},
                      (const char *[]){c->k_embd, why_out});
}

static tsr_status to_embd(const struct gcheck *c, int il, const char *suffix, int64_t in,
                          const char *why_in) {
  return layer_tensor(c, il, suffix, 2, (int64_t[]){in, c->n_embd},
                      (const char *[]){why_in, c->k_embd});
}

static tsr_status check_globals(struct gcheck *c) {
  const struct tsr_host *h = c->h;
  int32_t n_dims;
  int64_t ne[4];
  tsr_status st = tensor(c, "token_embd.weight", 2, (int64_t[]){c->n_embd, -1},
                         (const char *[]){c->k_embd, NULL});
  if (st == TSR_OK) st = h->gguf->weight_shape(c->m, "token_embd.weight", &n_dims, ne);
  if (st != TSR_OK) return st;
  c->n_vocab = ne[1];
  if (h->gguf->has_key(c->m, "tokenizer.ggml.tokens")) {
    int64_t n_tokens;
    st = h->gguf->arr_len(c->m, "tokenizer.ggml.tokens", &n_tokens);
    if (st == TSR_OK)
      st = tensor(c, "token_embd.weight", 2, (int64_t[]){c->n_embd, n_tokens},
                  (const char *[]){c->k_embd, "tokenizer.ggml.tokens' count"});
  }
  if (st == TSR_OK && h->gguf->has_weight(c->m, "output.weight"))
    st = tensor(c, "output.weight", 2, (int64_t[]){c->n_embd, c->n_vocab},
                (const char *[]){c->k_embd, "the vocabulary (token_embd.weight's rows)"});
  if (st == TSR_OK)
    st = tensor(c, "output_norm.weight", 1, (int64_t[]){c->n_embd}, (const char *[]){c->k_embd});
  return st;
}

/* Layer il's attention. A layer reading another's K/V has no K/V of its own. */
static tsr_status check_attention(const struct gcheck *c, const struct tsr_arch_layer *L, int il) {
  const int64_t nh = L->n_head, nkv = L->n_head_kv, dk = L->head_dim_k, dv = L->head_dim_v;
  const char *sfx = c->gemma3 || L->kind != TSR_LAYER_SLIDING ? "" : "_swa";
  char why_q[192], why_k[192], why_v[192], why_o[192], k_dk[128];
  snprintf(why_q, sizeof why_q, "%s.attention.head_count x key_length%s (%lld x %lld)", c->arch,
           sfx, (long long)nh, (long long)dk);
  snprintf(why_k, sizeof why_k, "%s.attention.head_count_kv x key_length%s (%lld x %lld)",
           c->arch, sfx, (long long)nkv, (long long)dk);
  snprintf(why_v, sizeof why_v, "%s.attention.head_count_kv x value_length%s (%lld x %lld)",
           c->arch, sfx, (long long)nkv, (long long)dv);
  snprintf(why_o, sizeof why_o, "%s.attention.head_count x value_length%s (%lld x %lld)",
           c->arch, sfx, (long long)nh, (long long)dv);
  snprintf(k_dk, sizeof k_dk, "%s.attention.key_length%s", c->arch, sfx);
  tsr_status st = embd_vector(c, il, "attn_norm.weight");
  if (st == TSR_OK) st = from_embd(c, il, "attn_q.weight", nh * dk, why_q);
  if (st == TSR_OK)
    st = layer_tensor(c, il, "attn_q_norm.weight", 1, (int64_t[]){dk}, (const char *[]){k_dk});
  if (st == TSR_OK) st = to_embd(c, il, "attn_output.weight", nh * dv, why_o);
  if (st == TSR_OK) st = embd_vector(c, il, "post_attention_norm.weight");
  if (st != TSR_OK || L->kv_shared_from) return st;
  st = from_embd(c, il, "attn_k.weight", nkv * dk, why_k);
  if (st == TSR_OK)
    st = layer_tensor(c, il, "attn_k_norm.weight", 1, (int64_t[]){dk}, (const char *[]){k_dk});
  char name[128];
  snprintf(name, sizeof name, "blk.%d.attn_v.weight", il);
  if (st == TSR_OK && (c->gemma3 || c->h->gguf->has_weight(c->m, name)))
    st = from_embd(c, il, "attn_v.weight", nkv * dv, why_v);
  return st;
}

/* The dense MLP: feed_forward_length is one value or one per layer. */
static tsr_status check_mlp(const struct gcheck *c, int il, int32_t n_layers) {
  char key[128], why[160];
  const struct tsr_host *h = c->h;
  int64_t n_ff = -1, len;
  tsr_status st = TSR_OK;
  key_of(key, sizeof key, c->arch, "feed_forward_length");
  snprintf(why, sizeof why, "%s", key);
  if (h->gguf->has_key(c->m, key) && h->gguf->arr_len(c->m, key, &len) == TSR_OK) {
    if (len != n_layers)
      return h->set_error(TSR_ERR_FORMAT, "%s has %lld elements for %d layers", key,
                          (long long)len, n_layers);
    st = h->gguf->arr_i64(c->m, key, il, &n_ff);
    snprintf(why, sizeof why, "%s[%d]", key, il);
  } else {
    st = opt_u32(c, "feed_forward_length", -1, &n_ff);
  }
  if (st == TSR_OK) st = embd_vector(c, il, "ffn_norm.weight");
  if (st == TSR_OK) st = from_embd(c, il, "ffn_gate.weight", n_ff, why);
  if (st == TSR_OK) st = from_embd(c, il, "ffn_up.weight", n_ff, why);
  if (st == TSR_OK) st = to_embd(c, il, "ffn_down.weight", n_ff, why);
  if (st == TSR_OK) st = embd_vector(c, il, "post_ffw_norm.weight");
  return st;
}

/* Gemma 4's routed experts beside the MLP. */
static tsr_status check_moe(const struct gcheck *c, int il, int64_t n_expert) {
  char k_exp[128], k_ffe[128], why_up[160];
  int64_t n_ffe;
  tsr_status st = opt_u32(c, "expert_feed_forward_length", -1, &n_ffe);
  if (st != TSR_OK) return st;
  key_of(k_exp, sizeof k_exp, c->arch, "expert_count");
  key_of(k_ffe, sizeof k_ffe, c->arch, "expert_feed_forward_length");
  snprintf(why_up, sizeof why_up, "2 x %s", k_ffe);
  st = from_embd(c, il, "ffn_gate_inp.weight", n_expert, k_exp);
  if (st == TSR_OK) st = embd_vector(c, il, "ffn_gate_inp.scale");
  if (st == TSR_OK)
    st = layer_tensor(c, il, "ffn_down_exps.scale", 1, (int64_t[]){n_expert},
                      (const char *[]){k_exp});
  if (st == TSR_OK)
    st = layer_tensor(c, il, "ffn_gate_up_exps.weight", 3,
                      (int64_t[]){c->n_embd, n_ffe < 0 ? -1 : 2 * n_ffe, n_expert},
                      (const char *[]){c->k_embd, why_up, k_exp});
  if (st == TSR_OK)
    st = layer_tensor(c, il, "ffn_down_exps.weight", 3, (int64_t[]){n_ffe, c->n_embd, n_expert},
                      (const char *[]){k_ffe, c->k_embd, k_exp});
  static const char *const norms[] = {"post_ffw_norm_1.weight", "pre_ffw_norm_2.weight",
                                      "post_ffw_norm_2.weight"};
  for (int k = 0; k < 3 && st == TSR_OK; k++) st = embd_vector(c, il, norms[k]);
  return st;
}

/* E2B/E4B's per-layer inputs: the tables, then each layer's gate and projection. */
static tsr_status check_per_layer_tables(const struct gcheck *c, int64_t P, int32_t n_layers) {
  char k_p[128], why[192];
  key_of(k_p, sizeof k_p, c->arch, "embedding_length_per_layer_input");
  snprintf(why, sizeof why, "%s x block_count (%lld x %d)", k_p, (long long)P, n_layers);
  tsr_status st = tensor(c, "per_layer_token_embd.weight", 2, (int64_t[]){P * n_layers, c->n_vocab},
                         (const char *[]){why, "the vocabulary (token_embd.weight's rows)"});
  if (st == TSR_OK)
    st = tensor(c, "per_layer_model_proj.weight", 2, (int64_t[]){c->n_embd, P * n_layers},
                (const char *[]){c->k_embd, why});
  if (st == TSR_OK)
    st = tensor(c, "per_layer_proj_norm.weight", 1, (int64_t[]){P}, (const char *[]){k_p});
  return st;
}

static tsr_status check_per_layer_block(const struct gcheck *c, int il, int64_t P) {
  char k_p[128];
  key_of(k_p, sizeof k_p, c->arch, "embedding_length_per_layer_input");
  tsr_status st = from_embd(c, il, "inp_gate.weight", P, k_p);
  if (st == TSR_OK) st = to_embd(c, il, "proj.weight", P, k_p);
  if (st == TSR_OK) st = embd_vector(c, il, "post_norm.weight");
  return st;
}

/* The assistant drafter's projections from and to the target's hidden size. */
static tsr_status check_assistant(const struct gcheck *c) {
  char k_out[128], why[160];
  int64_t n_out, top_k;
  tsr_status st = opt_u32(c, "embedding_length_out", -1, &n_out);
  if (st == TSR_OK) st = opt_u32(c, "centroid_intermediate_top_k", 0, &top_k);
  if (st != TSR_OK) return st;
  key_of(k_out, sizeof k_out, c->arch, "embedding_length_out");
  snprintf(why, sizeof why, "2 x %s", k_out);
  st = tensor(c, "nextn.pre_projection.weight", 2,
              (int64_t[]){n_out < 0 ? -1 : 2 * n_out, c->n_embd},
              (const char *[]){why, c->k_embd});
  if (st == TSR_OK)
    st = tensor(c, "nextn.post_projection.weight", 2, (int64_t[]){c->n_embd, n_out},
                (const char *[]){c->k_embd, k_out});
  if (st == TSR_OK && top_k) {
    st = tensor(c, "masked_embd_centroids.weight", 2, (int64_t[]){c->n_embd, -1},
                (const char *[]){c->k_embd, NULL});
    if (st == TSR_OK)
      st = tensor(c, "masked_embd_ordering", 1, (int64_t[]){c->n_vocab},
                  (const char *[]){"the vocabulary (token_embd.weight's rows)"});
  }
  return st;
}

/* Whether every layer of a kind that owns its K/V has attn_v, or none does. */
static tsr_status check_v_uniform(const struct gcheck *c, const struct tsr_arch_layer *layers,
                                  int32_t n_layers) {
  tsr_status st = TSR_OK;
  for (int kind = 0; kind < TSR_LAYER_KIND_COUNT && st == TSR_OK; kind++) {
    int32_t owning[GEMMA4_MAX_LAYERS], n = 0;
    for (int32_t il = 0; il < n_layers; il++)
      if ((int)layers[il].kind == kind && !layers[il].kv_shared_from) owning[n++] = il;
    bool present;
    st = c->h->gguf->check_layer_weights(c->m, "attn_v.weight", owning, n, &present);
  }
  return st;
}

tsr_status gemma4_validate(void *ctx, const struct tsr_host *h, const struct tsr_gguf *m,
                           const struct tsr_arch_layer *layers, int32_t n_layers) {
  (void)ctx;
  struct gcheck c = {.h = h, .m = m};
  tsr_status st = h->gguf->get_str(m, "general.architecture", &c.arch);
  if (st != TSR_OK) return st;
  c.gemma3 = !strcmp(c.arch, "gemma3");
  c.assistant = !strcmp(c.arch, "gemma4-assistant");
  if (n_layers > GEMMA4_MAX_LAYERS)
    return h->set_error(TSR_ERR_UNSUPPORTED, "arch_gemma4: %d layers", n_layers);
  key_of(c.k_embd, sizeof c.k_embd, c.arch, "embedding_length");
  uint32_t n_embd;
  st = h->gguf->get_u32(m, c.k_embd, &n_embd);
  static const char *const floats[] = {"attention.layer_norm_rms_epsilon", "rope.freq_base",
                                       "rope.freq_base_swa", "rope.scaling.factor",
                                       "final_logit_softcapping", "attn_logit_softcapping"};
  for (size_t k = 0; k < sizeof floats / sizeof floats[0] && st == TSR_OK; k++)
    st = positive(&c, floats[k]);
  if (st != TSR_OK) return st;
  c.n_embd = n_embd;
  if ((st = check_globals(&c)) != TSR_OK) return st;

  int64_t n_expert = 0, P = 0, n_used = 0, n_rot = 0;
  if (!c.gemma3) {
    st = opt_u32(&c, "expert_count", 0, &n_expert);
    if (st == TSR_OK) st = opt_u32(&c, "expert_used_count", 0, &n_used);
    if (st == TSR_OK) st = opt_u32(&c, "embedding_length_per_layer_input", 0, &P);
    if (st == TSR_OK) st = opt_u32(&c, "rope.dimension_count", 0, &n_rot);
    if (st != TSR_OK) return st;
  }
  if (n_expert && (n_used < 1 || n_used > n_expert))
    return h->set_error(TSR_ERR_FORMAT, "%s.expert_used_count is %lld: must be 1..%s."
                        "expert_count (%lld)", c.arch, (long long)n_used, c.arch,
                        (long long)n_expert);
  if (h->gguf->has_weight(m, "rope_freqs.weight")) {
    /* it scales the full layers' rotated pairs: half their rotary dims */
    int64_t full_rot = n_rot;
    for (int32_t il = 0; il < n_layers && !full_rot; il++)
      if (layers[il].kind == TSR_LAYER_FULL) full_rot = layers[il].head_dim_k;
    char why[160];
    snprintf(why, sizeof why, "%s.rope.dimension_count / 2", c.arch);
    if (full_rot) st = tensor(&c, "rope_freqs.weight", 1, (int64_t[]){full_rot / 2},
                              (const char *[]){why});
  }
  if (st == TSR_OK && c.assistant) st = check_assistant(&c);
  if (st == TSR_OK && P > 0) st = check_per_layer_tables(&c, P, n_layers);
  if (st == TSR_OK) st = check_v_uniform(&c, layers, n_layers);
  bool moe = false;
  if (st == TSR_OK && n_expert) {
    int32_t all[GEMMA4_MAX_LAYERS];
    for (int32_t il = 0; il < n_layers; il++) all[il] = il;
    st = h->gguf->check_layer_weights(m, "ffn_gate_inp.weight", all, n_layers, &moe);
  }
  for (int32_t il = 0; il < n_layers && st == TSR_OK; il++) {
    st = check_attention(&c, &layers[il], il);
    if (st == TSR_OK) st = check_mlp(&c, il, n_layers);
    if (st == TSR_OK && moe) st = check_moe(&c, il, n_expert);
    if (st == TSR_OK && P > 0) st = check_per_layer_block(&c, il, P);
    if (st == TSR_OK && !c.gemma3)
      st = layer_tensor(&c, il, "layer_output_scale.weight", 1, (int64_t[]){1}, NULL);
  }
  return st;
}
