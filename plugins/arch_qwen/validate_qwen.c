/*
** arch_qwen's validate(): a Qwen GGUF's hyperparameters against its tensors,
** at load, so that a file whose keys and tensors disagree is refused naming
** both instead of running with one of them silently ignored.
**
**   token_embd.weight   [embedding_length, V]; V = tokenizer.ggml.tokens' count
**   output.weight       [embedding_length, V] when present (else tied)
**   full attention      attn_q [E, H*Dk] (x2 on the hybrids: [q | gate] per head),
**                       attn_k [E, Hkv*Dk], attn_v [E, Hkv*Dv], attn_output [H*Dv, E];
**                       q/k norms [Dk] and q/k/v biases in every full layer or none
**   dense FFN           ffn_gate/up [E, feed_forward_length], ffn_down [F, E]
**   experts             ffn_gate_inp [E, expert_count], ffn_{gate,up}_exps
**                       [E, expert_feed_forward_length, expert_count], ffn_down_exps
**                       [F', E, expert_count]; the shared expert (qwen35moe) in
**                       every layer or none, [E, expert_shared_feed_forward_length]
**   Gated DeltaNet      the ssm.* keys' shapes (linear_state_bytes in arch_qwen.c
**                       has checked the keys agree with each other)
**   NextN block         eh_proj [2E, E], its norms [E]
** and the float keys a forward pass reads are finite and positive. qwen3next
** runs no forward pass here: only its embedding and output are checked.
*/
#include <stdio.h>
#include <string.h>

#include "forward_qwen.h"

struct qcheck {
  const struct tsr_host *h;
  const struct tsr_gguf *m;
  const char *arch;
  int64_t n_embd, n_vocab;
  char k_embd[96];
};

static const char *key_of(char *buf, size_t cap, const char *arch, const char *suffix) {
  snprintf(buf, cap, "%s.%s", arch, suffix);
  return buf;
}

/* the u32 key arch.SUFFIX, or `dflt` when the file has none */
static tsr_status opt_u32(const struct qcheck *c, const char *suffix, int64_t dflt, int64_t *out) {
  char key[96];
  uint32_t v;
  *out = dflt;
  if (!c->h->gguf->has_key(c->m, key_of(key, sizeof key, c->arch, suffix))) return TSR_OK;
  tsr_status st = c->h->gguf->get_u32(c->m, key, &v);
  if (st == TSR_OK) *out = v;
  return st;
}

/* a float key the forward pass reads, when present: finite and positive */
static tsr_status positive(const struct qcheck *c, const char *suffix) {
  char key[96];
  float v;
  if (!c->h->gguf->has_key(c->m, key_of(key, sizeof key, c->arch, suffix))) return TSR_OK;
  return c->h->gguf->f32_positive(c->m, key, &v);
}

/* blk.IL.SUFFIX with dims ne (-1: any), each implied by why[i] */
static tsr_status layer_tensor(const struct qcheck *c, int il, const char *suffix, int n_dims,
                               const int64_t *ne, const char *const *why) {
  char name[96];
  snprintf(name, sizeof name, "blk.%d.%s", il, suffix);
  return c->h->gguf->check_weight(c->m, name, n_dims, ne, why);
}

/* A norm over the residual: [embedding_length]. */
static tsr_status embd_vector(const struct qcheck *c, int il, const char *suffix) {
  return layer_tensor(c, il, suffix, 1, (int64_t[]){c->n_embd}, (const char *[]){c->k_embd});
}

/* A projection from the residual to `out` rows (what why_out says). */
static tsr_status from_embd(const struct qcheck *c, int il, const char *suffix, int64_t out,
                            const char *why_out) {
  return layer_tensor(c, il, suffix, 2, (int64_t[]){c->n_embd, out},
                      (const char *[]){c->k_embd, why_out});
}

/* A projection of `in` columns back to the residual. */
static tsr_status to_embd(const struct qcheck *c, int il, const char *suffix, int64_t in,
                          const char *why_in) {
  return layer_tensor(c, il, suffix, 2, (int64_t[]){in, c->n_embd},
                      (const char *[]){why_in, c->k_embd});
}

/* Embedding, vocabulary, output head and final norm. */
static tsr_status check_globals(struct qcheck *c) {
  const struct tsr_host *h = c->h;
  int32_t n_dims;
  int64_t ne[4];
  tsr_status st = h->gguf->check_weight(c->m, "token_embd.weight", 2, (int64_t[]){c->n_embd, -1},
                                        (const char *[]){c->k_embd, NULL});
  if (st == TSR_OK) st = h->gguf->weight_shape(c->m, "token_embd.weight", &n_dims, ne);
  if (st != TSR_OK) return st;
  c->n_vocab = ne[1];
  char key[96];
  int64_t v;
  if ((st = opt_u32(c, "vocab_size", -1, &v)) != TSR_OK) return st;
  if (v >= 0)
    st = h->gguf->check_weight(
        c->m, "token_embd.weight", 2, (int64_t[]){c->n_embd, v},
        (const char *[]){c->k_embd, key_of(key, sizeof key, c->arch, "vocab_size")});
  if (st == TSR_OK && h->gguf->has_key(c->m, "tokenizer.ggml.tokens")) {
    int64_t n_tokens;
    st = h->gguf->arr_len(c->m, "tokenizer.ggml.tokens", &n_tokens);
    if (st == TSR_OK)
      st = h->gguf->check_weight(c->m, "token_embd.weight", 2, (int64_t[]){c->n_embd, n_tokens},
                                 (const char *[]){c->k_embd, "tokenizer.ggml.tokens' count"});
  }
  if (st == TSR_OK && h->gguf->has_weight(c->m, "output.weight"))
    st = h->gguf->check_weight(
        c->m, "output.weight", 2, (int64_t[]){c->n_embd, c->n_vocab},
        (const char *[]){c->k_embd, "the vocabulary (token_embd.weight's rows)"});
  if (st == TSR_OK)
    st = h->gguf->check_weight(c->m, "output_norm.weight", 1, (int64_t[]){c->n_embd},
                               (const char *[]){c->k_embd});
  return st;
}

/* Every full-attention layer's projections, and the optional tensors (q/k
** norms, biases) in all of them or none. */
static tsr_status check_attention(const struct qcheck *c, const struct tsr_arch_layer *layers,
                                  const int32_t *full, int32_t n_full, bool gated) {
  const struct tsr_host *h = c->h;
  tsr_status st = TSR_OK;
  for (int32_t i = 0; i < n_full && st == TSR_OK; i++) {
    const int il = full[i];
    const struct tsr_arch_layer *L = &layers[il];
    const int64_t nh = L->n_head, nkv = L->n_head_kv, dk = L->head_dim_k, dv = L->head_dim_v;
    char why_q[192], why_k[192], why_v[192], why_o[192];
    snprintf(why_q, sizeof why_q, "%s%s.attention.head_count x key_length (%lld x %lld)",
             gated ? "2 x " : "", c->arch, (long long)nh, (long long)dk);
    snprintf(why_k, sizeof why_k, "%s.attention.head_count_kv x key_length (%lld x %lld)",
             c->arch, (long long)nkv, (long long)dk);
    snprintf(why_v, sizeof why_v, "%s.attention.head_count_kv x value_length (%lld x %lld)",
             c->arch, (long long)nkv, (long long)dv);
    snprintf(why_o, sizeof why_o, "%s.attention.head_count x value_length (%lld x %lld)",
             c->arch, (long long)nh, (long long)dv);
    st = embd_vector(c, il, "attn_norm.weight");
    if (st == TSR_OK) st = from_embd(c, il, "attn_q.weight", (gated ? 2 : 1) * nh * dk, why_q);
    if (st == TSR_OK) st = from_embd(c, il, "attn_k.weight", nkv * dk, why_k);
    if (st == TSR_OK) st = from_embd(c, il, "attn_v.weight", nkv * dv, why_v);
    if (st == TSR_OK) st = to_embd(c, il, "attn_output.weight", nh * dv, why_o);
  }
  if (!n_full || st != TSR_OK) return st;
  /* the optional tensors: per-head q/k norms [Dk], biases as long as their
  ** projection's output (every full layer has the same heads) */
  const struct tsr_arch_layer *L = &layers[full[0]];
  const int64_t nh = L->n_head, nkv = L->n_head_kv, dk = L->head_dim_k, dv = L->head_dim_v;
  char key_k[96];
  key_of(key_k, sizeof key_k, c->arch, "attention.key_length");
  const struct {
    const char *suffix, *proj;
    int64_t n;
  } opt[] = {{"attn_q_norm.weight", NULL, dk}, {"attn_k_norm.weight", NULL, dk},
             {"attn_q.bias", "attn_q.weight", (gated ? 2 : 1) * nh * dk},
             {"attn_k.bias", "attn_k.weight", nkv * dk},
             {"attn_v.bias", "attn_v.weight", nkv * dv}};
  for (size_t k = 0; k < sizeof opt / sizeof opt[0] && st == TSR_OK; k++) {
    bool present;
    st = h->gguf->check_layer_weights(c->m, opt[k].suffix, full, n_full, &present);
    for (int32_t i = 0; i < n_full && st == TSR_OK && present; i++) {
      char why[96];
      if (opt[k].proj) snprintf(why, sizeof why, "blk.%d.%s's rows", full[i], opt[k].proj);
      st = layer_tensor(c, full[i], opt[k].suffix, 1, (int64_t[]){opt[k].n},
                        (const char *[]){opt[k].proj ? why : key_k});
    }
  }
  return st;
}

/* The FFN of layer il: dense SwiGLU, or routed experts (+ the shared one). */
static tsr_status check_ffn(const struct qcheck *c, int il, bool hybrid, int64_t n_expert,
                            bool shexp) {
  char k_ff[96], k_exp[96], k_ffe[96], k_ffs[96];
  const char *norm = hybrid ? "post_attention_norm.weight" : "ffn_norm.weight";
  tsr_status st = embd_vector(c, il, norm);
  if (st != TSR_OK) return st;
  if (!n_expert) {
    int64_t n_ff;
    if ((st = opt_u32(c, "feed_forward_length", -1, &n_ff)) != TSR_OK) return st;
    key_of(k_ff, sizeof k_ff, c->arch, "feed_forward_length");
    st = from_embd(c, il, "ffn_gate.weight", n_ff, k_ff);
    if (st == TSR_OK) st = from_embd(c, il, "ffn_up.weight", n_ff, k_ff);
    if (st == TSR_OK) st = to_embd(c, il, "ffn_down.weight", n_ff, k_ff);
    return st;
  }
  int64_t n_ffe, n_ffs;
  if ((st = opt_u32(c, "expert_feed_forward_length", -1, &n_ffe)) != TSR_OK) return st;
  key_of(k_exp, sizeof k_exp, c->arch, "expert_count");
  key_of(k_ffe, sizeof k_ffe, c->arch, "expert_feed_forward_length");
  st = from_embd(c, il, "ffn_gate_inp.weight", n_expert, k_exp);
  const int64_t up[3] = {c->n_embd, n_ffe, n_expert}, down[3] = {n_ffe, c->n_embd, n_expert};
  const char *why_up[3] = {c->k_embd, k_ffe, k_exp}, *why_down[3] = {k_ffe, c->k_embd, k_exp};
  if (st == TSR_OK) st = layer_tensor(c, il, "ffn_gate_exps.weight", 3, up, why_up);
  if (st == TSR_OK) st = layer_tensor(c, il, "ffn_up_exps.weight", 3, up, why_up);
  if (st == TSR_OK) st = layer_tensor(c, il, "ffn_down_exps.weight", 3, down, why_down);
  if (st != TSR_OK || !shexp) return st;
  if ((st = opt_u32(c, "expert_shared_feed_forward_length", -1, &n_ffs)) != TSR_OK) return st;
  key_of(k_ffs, sizeof k_ffs, c->arch, "expert_shared_feed_forward_length");
  st = from_embd(c, il, "ffn_gate_shexp.weight", n_ffs, k_ffs);
  if (st == TSR_OK) st = from_embd(c, il, "ffn_up_shexp.weight", n_ffs, k_ffs);
  if (st == TSR_OK) st = to_embd(c, il, "ffn_down_shexp.weight", n_ffs, k_ffs);
  if (st == TSR_OK) st = embd_vector(c, il, "ffn_gate_inp_shexp.weight");
  return st;
}

/* A Gated DeltaNet layer's tensors against the ssm.* keys. */
static tsr_status check_linear(const struct qcheck *c, int il) {
  int64_t conv, dk, hk, hv, inner;
  tsr_status st = opt_u32(c, "ssm.conv_kernel", -1, &conv);
  if (st == TSR_OK) st = opt_u32(c, "ssm.state_size", -1, &dk);
  if (st == TSR_OK) st = opt_u32(c, "ssm.group_count", -1, &hk);
  if (st == TSR_OK) st = opt_u32(c, "ssm.time_step_rank", -1, &hv);
  if (st == TSR_OK) st = opt_u32(c, "ssm.inner_size", -1, &inner);
  if (st != TSR_OK || hv <= 0) return st; /* describe() refused missing ones */
  const int64_t dv = inner / hv, n_ch = 2 * hk * dk + inner;
  char why_ch[160], k_inner[96], k_hv[96], k_conv[96], k_dv[160];
  snprintf(why_ch, sizeof why_ch, "2 x %s.ssm.group_count x state_size + inner_size "
           "(2 x %lld x %lld + %lld)", c->arch, (long long)hk, (long long)dk, (long long)inner);
  key_of(k_inner, sizeof k_inner, c->arch, "ssm.inner_size");
  key_of(k_hv, sizeof k_hv, c->arch, "ssm.time_step_rank");
  key_of(k_conv, sizeof k_conv, c->arch, "ssm.conv_kernel");
  snprintf(k_dv, sizeof k_dv, "%s.ssm.inner_size / time_step_rank", c->arch);
  st = embd_vector(c, il, "attn_norm.weight");
  if (st == TSR_OK) st = from_embd(c, il, "attn_qkv.weight", n_ch, why_ch);
  if (st == TSR_OK) st = from_embd(c, il, "attn_gate.weight", inner, k_inner);
  if (st == TSR_OK) st = from_embd(c, il, "ssm_beta.weight", hv, k_hv);
  if (st == TSR_OK) st = from_embd(c, il, "ssm_alpha.weight", hv, k_hv);
  if (st == TSR_OK)
    st = layer_tensor(c, il, "ssm_a", 1, (int64_t[]){hv}, (const char *[]){k_hv});
  if (st == TSR_OK)
    st = layer_tensor(c, il, "ssm_dt.bias", 1, (int64_t[]){hv}, (const char *[]){k_hv});
  if (st == TSR_OK)
    st = layer_tensor(c, il, "ssm_conv1d.weight", 2, (int64_t[]){conv, n_ch},
                      (const char *[]){k_conv, why_ch});
  if (st == TSR_OK)
    st = layer_tensor(c, il, "ssm_norm.weight", 1, (int64_t[]){dv}, (const char *[]){k_dv});
  if (st == TSR_OK) st = to_embd(c, il, "ssm_out.weight", inner, k_inner);
  return st;
}

/* The NextN block's own tensors (its decoder layer is checked with the trunk's). */
static tsr_status check_nextn(const struct qcheck *c, int il) {
  char why[128];
  snprintf(why, sizeof why, "2 x %s", c->k_embd);
  tsr_status st = layer_tensor(c, il, "nextn.eh_proj.weight", 2,
                               (int64_t[]){2 * c->n_embd, c->n_embd},
                               (const char *[]){why, c->k_embd});
  if (st == TSR_OK) st = embd_vector(c, il, "nextn.enorm.weight");
  if (st == TSR_OK) st = embd_vector(c, il, "nextn.hnorm.weight");
  static const char *const heads[] = {"nextn.embed_tokens.weight", "nextn.shared_head_head.weight"};
  for (int k = 0; k < 2 && st == TSR_OK; k++) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s", il, heads[k]);
    if (c->h->gguf->has_weight(c->m, name))
      st = from_embd(c, il, heads[k], c->n_vocab, "the vocabulary (token_embd.weight's rows)");
  }
  snprintf(why, sizeof why, "blk.%d.nextn.shared_head_norm.weight", il);
  if (st == TSR_OK && c->h->gguf->has_weight(c->m, why))
    st = embd_vector(c, il, "nextn.shared_head_norm.weight");
  return st;
}

tsr_status tsr_qwen_validate(void *ctx, const struct tsr_host *h, const struct tsr_gguf *m,
                             const struct tsr_arch_layer *layers, int32_t n_layers) {
  (void)ctx;
  struct qcheck c = {.h = h, .m = m};
  tsr_status st = h->gguf->get_str(m, "general.architecture", &c.arch);
  if (st != TSR_OK) return st;
  key_of(c.k_embd, sizeof c.k_embd, c.arch, "embedding_length");
  uint32_t n_embd;
  st = h->gguf->get_u32(m, c.k_embd, &n_embd);
  if (st == TSR_OK) st = positive(&c, "attention.layer_norm_rms_epsilon");
  if (st == TSR_OK) st = positive(&c, "rope.freq_base");
  if (st == TSR_OK) st = positive(&c, "rope.scaling.factor");
  if (st != TSR_OK) return st;
  c.n_embd = n_embd;
  if ((st = check_globals(&c)) != TSR_OK || !strcmp(c.arch, "qwen3next")) return st;

  const bool hybrid = !strcmp(c.arch, "qwen35") || !strcmp(c.arch, "qwen35moe");
  int64_t n_nextn, n_expert, n_used;
  st = opt_u32(&c, "nextn_predict_layers", 0, &n_nextn);
  if (st == TSR_OK) st = opt_u32(&c, "expert_count", 0, &n_expert);
  if (st == TSR_OK) st = opt_u32(&c, "expert_used_count", 0, &n_used);
  if (st != TSR_OK) return st;
  if (n_expert && (n_used < 1 || n_used > n_expert))
    return h->set_error(TSR_ERR_FORMAT, "%s.expert_used_count is %lld: must be 1..%s."
                        "expert_count (%lld)", c.arch, (long long)n_used, c.arch,
                        (long long)n_expert);
  int32_t full[512], n_full = 0, all[512];
  for (int32_t il = 0; il < n_layers && il < 512; il++) {
    all[il] = il;
    if (layers[il].kind == TSR_LAYER_FULL) full[n_full++] = il;
  }
  if (n_layers > 512) return h->set_error(TSR_ERR_UNSUPPORTED, "%d layers", n_layers);
  st = check_attention(&c, layers, full, n_full, hybrid);
  bool shexp = false;
  if (st == TSR_OK && n_expert)
    st = h->gguf->check_layer_weights(m, "ffn_gate_inp_shexp.weight", all, n_layers, &shexp);
  for (int32_t il = 0; il < n_layers && st == TSR_OK; il++) {
    st = check_ffn(&c, il, hybrid, n_expert, shexp);
    if (st == TSR_OK && layers[il].kind == TSR_LAYER_LINEAR) st = check_linear(&c, il);
    if (st == TSR_OK && il >= n_layers - n_nextn) st = check_nextn(&c, il);
  }
  return st;
}
