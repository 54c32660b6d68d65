/*
** The Qwen2 / Qwen3 / Qwen3-MoE forward pass, read top to bottom like the
** model card: token embedding; per layer a pre-norm attention block
** (q/k RMSNorm per head before NeoX RoPE on Qwen3, biases on Qwen2) and a
** pre-norm SwiGLU MLP or a top-k mixture of SwiGLU experts; final norm; LM
** head (tied to the embedding when output.weight is absent).
** With a KV cache (fw->kv) attention writes the batch's k/v into it and
** attends over every cell of the sequence (host->arch->kv_attend); without one,
** over the batch alone. Context shift (tsr_qwen_shift_keys) rotates cached
** keys with the same RoPE (rope_keys) the forward pass applies.
*/
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "forward_qwen.h"

struct qwen_hparams {
  const char *arch;
  uint32_t n_embd, n_head, n_head_kv, head_dim, n_expert, n_expert_used;
  float eps, rope_base;
  bool expert_norm; /* renormalise the top-k router weights */
  struct tsr_attn_rope rope; /* NeoX over the whole head at rope.freq_base */
};

/* What the file says about positions, for attention implementations that
** extend the context (struct tsr_attn_rope): the trained context, and the file
** and key prefix where such an implementation reads keys of its own. */
tsr_status tsr_qwen_rope_hints(const struct tsr_host *h, const struct tsr_gguf *m,
                               const char *arch, struct tsr_attn_rope *rope) {
  char key[128];
  uint32_t v = 0;
  tsr_status st = TSR_OK;
  snprintf(key, sizeof key, "%s.context_length", arch);
  if (h->gguf->has_key(m, key)) st = h->gguf->get_u32(m, key, &v);
  rope->n_ctx_train = v > INT32_MAX ? INT32_MAX : (int32_t)v;
  rope->model = m;
  rope->arch = arch;
  return st;
}

static tsr_status read_hparams(const struct tsr_host *h, const struct tsr_gguf *m,
                               const struct tsr_arch_layer *layers, struct qwen_hparams *hp) {
  char key[96];
  tsr_status st = h->gguf->get_str(m, "general.architecture", &hp->arch);
#define U32(suffix, out)                                                                           \
  (snprintf(key, sizeof key, "%s." suffix, hp->arch), h->gguf->get_u32(m, key, out))
#define F32(suffix, out)                                                                           \
  (snprintf(key, sizeof key, "%s." suffix, hp->arch), h->gguf->get_f32(m, key, out))
  if (st == TSR_OK) st = U32("embedding_length", &hp->n_embd);
  if (st == TSR_OK) st = F32("attention.layer_norm_rms_epsilon", &hp->eps);
  if (st == TSR_OK) st = F32("rope.freq_base", &hp->rope_base);
  if (st != TSR_OK) return st;
  /* describe() already validated the head shapes */
  hp->n_head = (uint32_t)layers[0].n_head;
  hp->n_head_kv = (uint32_t)layers[0].n_head_kv;
  hp->head_dim = (uint32_t)layers[0].head_dim_k;
  hp->n_expert = hp->n_expert_used = 0;
  hp->expert_norm = true; /* what Qwen3-MoE checkpoints ship; a file may say otherwise */
  snprintf(key, sizeof key, "%s.expert_count", hp->arch);
  if (h->gguf->has_key(m, key)) {
    st = U32("expert_count", &hp->n_expert);
    if (st == TSR_OK) st = U32("expert_used_count", &hp->n_expert_used);
    snprintf(key, sizeof key, "%s.expert_weights_norm", hp->arch);
    if (st == TSR_OK && h->gguf->has_key(m, key)) st = h->gguf->get_bool(m, key, &hp->expert_norm);
  }
#undef U32
#undef F32
  hp->rope = (struct tsr_attn_rope){.struct_size = sizeof hp->rope, .n_rot = (int32_t)hp->head_dim,
                                    .neox = 1, .freq_base = hp->rope_base, .freq_scale = 1.0f};
  if (st == TSR_OK) st = tsr_qwen_rope_hints(h, m, hp->arch, &hp->rope);
  return st;
}

struct tsr_tensor *tsr_qwen_layer_weight(const struct tsr_host *h, struct tsr_arch_forward *fw,
                                         int il, const char *name) {
  char full[96];
  snprintf(full, sizeof full, "blk.%d.%s", il, name);
  return h->graph->weight(fw->g, fw->model, full);
}

struct tsr_tensor *tsr_qwen_optional_layer_weight(const struct tsr_host *h,
                                                  struct tsr_arch_forward *fw, int il,
                                                  const char *name) {
  char full[96];
  snprintf(full, sizeof full, "blk.%d.%s", il, name);
  return h->gguf->has_weight(fw->model, full) ? h->graph->weight(fw->g, fw->model, full) : NULL;
}

/* x·W (+ b when the file has the bias, as Qwen2's q/k/v do) */
struct tsr_tensor *tsr_qwen_linear(const struct tsr_host *h, struct tsr_arch_forward *fw, int il,
                                   const char *name, struct tsr_tensor *x) {
  char w_name[64], b_name[64];
  snprintf(w_name, sizeof w_name, "%s.weight", name);
  snprintf(b_name, sizeof b_name, "%s.bias", name);
  struct tsr_tensor *y = h->graph->mat_mul(fw->g, tsr_qwen_layer_weight(h, fw, il, w_name), x);
  struct tsr_tensor *b = tsr_qwen_optional_layer_weight(h, fw, il, b_name);
  return b ? h->graph->add(fw->g, y, b) : y;
}

static struct tsr_tensor *attention_block(const struct tsr_host *h, struct tsr_arch_forward *fw,
                                          const struct qwen_hparams *hp, int il,
                                          struct tsr_tensor *x) {
  struct tsr_graph *g = fw->g;
  const int64_t n = fw->n_tokens, hd = hp->head_dim;
  struct tsr_tensor *q = tsr_qwen_linear(h, fw, il, "attn_q", x);
  struct tsr_tensor *k = tsr_qwen_linear(h, fw, il, "attn_k", x);
  struct tsr_tensor *v = tsr_qwen_linear(h, fw, il, "attn_v", x);
  q = h->graph->reshape(g, q, 3, (int64_t[]){hd, hp->n_head, n});
  k = h->graph->reshape(g, k, 3, (int64_t[]){hd, hp->n_head_kv, n});
  v = h->graph->reshape(g, v, 3, (int64_t[]){hd, hp->n_head_kv, n});
  /* Qwen3 normalises q and k per head before RoPE; Qwen2 has no such norm */
  struct tsr_tensor *q_norm = tsr_qwen_optional_layer_weight(h, fw, il, "attn_q_norm.weight");
  struct tsr_tensor *k_norm = tsr_qwen_optional_layer_weight(h, fw, il, "attn_k_norm.weight");
  if (q_norm) q = h->graph->rms_norm(g, q, q_norm, hp->eps);
  if (k_norm) k = h->graph->rms_norm(g, k, k_norm, hp->eps);
  /* RoPE at each token's position, or as the attention places q and k itself */
  q = h->arch->attn_rope(fw, il, &hp->rope, q, false);
  k = h->arch->attn_rope(fw, il, &hp->rope, k, true);
  /* attention wants [head_dim, tokens, heads] */
  q = h->graph->permute(g, q, 0, 2, 1, 3);
  k = h->graph->permute(g, k, 0, 2, 1, 3);
  v = h->graph->permute(g, v, 0, 2, 1, 3);
  struct tsr_layer_desc desc = {
      .struct_size = sizeof desc, .layer = il, .kind = TSR_LAYER_FULL, .n_head = (int32_t)hp->n_head,
      .n_head_kv = (int32_t)hp->n_head_kv, .head_dim_k = (int32_t)hd, .head_dim_v = (int32_t)hd,
      .k_codec = "f32", .v_codec = "f32", .backend = "cpu"};
  struct tsr_attn_call call = {
      .struct_size = sizeof call, .layer = &desc, .q = q, .k = k, .v = v,
      .q_pos = fw->positions, .kv_pos = fw->positions, .scale = 1.0f / sqrtf((float)hd),
      .causal = true, .rope = &hp->rope};
  /* with a cache: write this batch's k/v, attend over every cell of the sequence */
  if (fw->kv && h->arch->kv_attend(fw, il, k, v, &call) != TSR_OK) return NULL;
  struct tsr_tensor *o = h->arch->attn_build(fw, il, &call);
  o = h->graph->reshape(g, o, 2, (int64_t[]){hd * hp->n_head, n});
  return tsr_qwen_linear(h, fw, il, "attn_output", o);
}

struct tsr_tensor *tsr_qwen_mlp_block(const struct tsr_host *h, struct tsr_arch_forward *fw, int il,
                                      const char *suffix, struct tsr_tensor *x) {
  char name[32];
  snprintf(name, sizeof name, "ffn_gate%s", suffix);
  struct tsr_tensor *gate = tsr_qwen_linear(h, fw, il, name, x);
  snprintf(name, sizeof name, "ffn_up%s", suffix);
  struct tsr_tensor *up = tsr_qwen_linear(h, fw, il, name, x);
  snprintf(name, sizeof name, "ffn_down%s", suffix);
  return tsr_qwen_linear(h, fw, il, name, h->graph->glu(fw->g, gate, up, 0 /* swiglu */, false));
}

/* Top-k routed SwiGLU experts: p = softmax(router·x); the k largest are
** weighted by p (or by p renormalised over the k, when expert_norm). */
struct tsr_tensor *tsr_qwen_moe_block(const struct tsr_host *h, struct tsr_arch_forward *fw,
                                      const struct tsr_qwen_moe *moe, int il,
                                      struct tsr_tensor *x) {
  struct tsr_graph *g = fw->g;
  const int64_t n = fw->n_tokens, k = moe->n_expert_used, e = moe->n_expert;
  struct tsr_tensor *router = tsr_qwen_layer_weight(h, fw, il, "ffn_gate_inp.weight");
  struct tsr_tensor *logits = h->graph->mat_mul(g, router, x);
  struct tsr_tensor *probs = h->graph->softmax(g, logits, NULL, 1.0f);
  struct tsr_tensor *ids = h->graph->top_k(g, probs, (int32_t)k); /* [k, n] */
  /* renormalised top-k probabilities are the softmax of the chosen logits */
  struct tsr_tensor *source = moe->expert_norm ? logits : probs;
  struct tsr_tensor *chosen = h->graph->get_rows(
      g, h->graph->reshape(g, source, 3, (int64_t[]){1, e, n}), ids); /* [1, k, n] */
  if (moe->expert_norm)
    chosen = h->graph->reshape(
        g, h->graph->softmax(g, h->graph->reshape(g, chosen, 2, (int64_t[]){k, n}), NULL, 1.0f), 3,
        (int64_t[]){1, k, n});

  struct tsr_tensor *xe = h->graph->reshape(g, x, 3, (int64_t[]){moe->n_embd, 1, n});
  struct tsr_tensor *gate_exps = tsr_qwen_layer_weight(h, fw, il, "ffn_gate_exps.weight");
  struct tsr_tensor *up_exps = tsr_qwen_layer_weight(h, fw, il, "ffn_up_exps.weight");
  struct tsr_tensor *down_exps = tsr_qwen_layer_weight(h, fw, il, "ffn_down_exps.weight");
  struct tsr_tensor *gate = h->graph->mat_mul_id(g, gate_exps, xe, ids);
  struct tsr_tensor *up = h->graph->mat_mul_id(g, up_exps, xe, ids);
  struct tsr_tensor *act = h->graph->glu(g, gate, up, 0 /* swiglu */, false); /* [ff, k, n] */
  struct tsr_tensor *down = h->graph->mat_mul_id(g, down_exps, act, ids);     /* [embd, k, n] */
  struct tsr_tensor *weighted = h->graph->mul(g, down, chosen);
  return weighted ? tsr_graph_sum_slots(h->graph, g, weighted) : NULL; /* over the k experts */
}

tsr_status tsr_qwen_build(void *ctx, const struct tsr_host *h, struct tsr_arch_forward *fw) {
  const char *arch;
  tsr_status st = h->gguf->get_str(fw->model, "general.architecture", &arch);
  if (st != TSR_OK) return st;
  if (!strcmp(arch, "qwen35") || !strcmp(arch, "qwen35moe")) return tsr_qwen35_build(ctx, h, fw);
  struct qwen_hparams hp;
  if ((st = read_hparams(h, fw->model, fw->layers, &hp)) != TSR_OK) return st;
  if (strcmp(hp.arch, "qwen2") && strcmp(hp.arch, "qwen3") && strcmp(hp.arch, "qwen3moe"))
    return h->set_error(TSR_ERR_UNSUPPORTED, "arch_qwen: forward pass of '%s' is not built in "
                        "this version (qwen2, qwen3, qwen3moe, qwen35, qwen35moe are)", hp.arch);
  const struct tsr_qwen_moe moe = {.n_embd = hp.n_embd, .n_expert = hp.n_expert,
                                   .n_expert_used = hp.n_expert_used,
                                   .expert_norm = hp.expert_norm};
  struct tsr_graph *g = fw->g;
  struct tsr_tensor *x =
      h->graph->get_rows(g, h->graph->weight(g, fw->model, "token_embd.weight"), fw->tokens);
  fw->embed = x;
  for (int il = 0; il < fw->n_layers; il++) {
    struct tsr_tensor *a =
        h->graph->rms_norm(g, x, tsr_qwen_layer_weight(h, fw, il, "attn_norm.weight"), hp.eps);
    x = h->graph->add(g, x, attention_block(h, fw, &hp, il, a));
    struct tsr_tensor *m =
        h->graph->rms_norm(g, x, tsr_qwen_layer_weight(h, fw, il, "ffn_norm.weight"), hp.eps);
    x = h->graph->add(g, x,
                      hp.n_expert ? tsr_qwen_moe_block(h, fw, &moe, il, m)
                                  : tsr_qwen_mlp_block(h, fw, il, "", m));
    if (fw->hidden) fw->hidden[il] = x;
  }
  x = h->graph->rms_norm(g, tsr_arch_output_rows(h, fw, x),
                         h->graph->weight(g, fw->model, "output_norm.weight"), hp.eps);
  fw->hidden_final = x;
  const char *head =
      h->gguf->has_weight(fw->model, "output.weight") ? "output.weight" : "token_embd.weight";
  fw->logits = h->graph->mat_mul(g, h->graph->weight(g, fw->model, head), x);
  /* on failure the graph holds the first builder error and its message */
  return fw->logits ? TSR_OK : TSR_ERR_INVALID_ARG;
}

tsr_status tsr_qwen_shift_keys(void *ctx, const struct tsr_host *h, struct tsr_kv_shift *sh) {
  (void)ctx;
  const char *arch;
  tsr_status st = h->gguf->get_str(sh->model, "general.architecture", &arch);
  if (st != TSR_OK) return st;
  if (strcmp(arch, "qwen2") && strcmp(arch, "qwen3") && strcmp(arch, "qwen3moe"))
    return h->set_error(TSR_ERR_UNSUPPORTED, "arch_qwen: '%s' cannot shift its context (its "
                        "linear layers' recurrent state holds every token; qwen2, qwen3 and "
                        "qwen3moe can)", arch);
  struct qwen_hparams hp;
  if ((st = read_hparams(h, sh->model, sh->layers, &hp)) != TSR_OK) return st;
  for (int32_t il = 0; il < sh->n_layers && st == TSR_OK; il++) {
    struct tsr_tensor *k, *delta_pos;
    st = h->arch->kv_shift_k(sh, il, &k, &delta_pos);
    if (st == TSR_OK && k)
      st = h->arch->kv_shift_store(sh, il, h->arch->kv_shift_rope(sh, il, &hp.rope, k, delta_pos));
  }
  return st;
}
