/*
** The Qwen3.5 / Qwen3.5-MoE hybrid forward pass (GGUF archs qwen35,
** qwen35moe), read top to bottom like the model card:
**   token embedding;
**   per trunk layer  h += Mixer(RMSNorm(h)); h += FFN(RMSNorm(h)), where the
**     mixer is a Gated DeltaNet (linear) layer, or every
**     full_attention_interval-th layer a gated full-attention layer, and the
**     FFN a dense SwiGLU (qwen35) or routed experts plus a sigmoid-gated
**     shared expert (qwen35moe);
**   final norm; LM head (tied to the embedding when output.weight is absent).
** The converter folded the zero-centred norms' +1 into the GGUF weights, so
** every norm here is a plain x̂·w. The NextN/MTP block the converter appends
** after the trunk is not part of this pass (transformers ignores it too).
**
** Without a KV cache (fw->kv NULL) the batch is the whole sequence: the conv
** and delta-rule states start at zero and are dropped. With one, full
** attention reads the cache through host->arch->kv_attend and each Gated DeltaNet
** layer carries its state in its slot (host->arch->kv_state), laid out in f32 as
**   [K-1, C]       conv history: the last conv_kernel-1 inputs of each of
**                  the C = 2*Hk*dk + Hv*dv conv channels, oldest first;
**   [dv, Hv, dk]   the delta-rule state S (slot[j, h, i] = S_h[i][j]),
** the conv1d and delta_rule ops reading it and writing it back in place.
*/
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "forward_qwen.h"
#include "ops_deltanet.h"

struct qwen35_hparams {
  const char *arch;
  uint32_t n_embd, n_rot;
  float eps, rope_base;
  /* full attention, from describe()'s plan */
  int32_t n_head, n_head_kv, head_dim;
  /* Gated DeltaNet */
  uint32_t conv_kernel, dk, hk, hv, dv;
  uint32_t n_nextn;
  struct tsr_qwen_moe moe; /* n_expert 0: dense FFN */
  struct tsr_attn_rope rope; /* partial NeoX: the first n_rot dims at rope.freq_base */
};

static tsr_status read_hparams(const struct tsr_host *h, const struct tsr_arch_forward *fw,
                               struct qwen35_hparams *hp) {
  const struct tsr_gguf *m = fw->model;
  char key[96];
  uint32_t inner = 0, n_expert = 0, n_used = 0;
  tsr_status st = h->gguf->get_str(m, "general.architecture", &hp->arch);
  if (st != TSR_OK) return st;
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, hp->arch), key)
  st = h->gguf->get_u32(m, KEY("embedding_length"), &hp->n_embd);
  if (st == TSR_OK) st = h->gguf->get_f32(m, KEY("attention.layer_norm_rms_epsilon"), &hp->eps);
  if (st == TSR_OK) st = h->gguf->get_f32(m, KEY("rope.freq_base"), &hp->rope_base);
  if (st == TSR_OK) st = h->gguf->get_u32(m, KEY("rope.dimension_count"), &hp->n_rot);
  if (st == TSR_OK) st = h->gguf->get_u32(m, KEY("ssm.conv_kernel"), &hp->conv_kernel);
  if (st == TSR_OK) st = h->gguf->get_u32(m, KEY("ssm.state_size"), &hp->dk);
  if (st == TSR_OK) st = h->gguf->get_u32(m, KEY("ssm.group_count"), &hp->hk);
  if (st == TSR_OK) st = h->gguf->get_u32(m, KEY("ssm.time_step_rank"), &hp->hv);
  if (st == TSR_OK) st = h->gguf->get_u32(m, KEY("ssm.inner_size"), &inner);
  hp->n_nextn = 0;
  if (st == TSR_OK && h->gguf->has_key(m, KEY("nextn_predict_layers")))
    st = h->gguf->get_u32(m, key, &hp->n_nextn);
  hp->moe = (struct tsr_qwen_moe){.n_embd = hp->n_embd, .expert_norm = true};
  if (st == TSR_OK && h->gguf->has_key(m, KEY("expert_count"))) {
    st = h->gguf->get_u32(m, key, &n_expert);
    if (st == TSR_OK) st = h->gguf->get_u32(m, KEY("expert_used_count"), &n_used);
    if (st == TSR_OK && h->gguf->has_key(m, KEY("expert_weights_norm")))
      st = h->gguf->get_bool(m, key, &hp->moe.expert_norm);
  }
#undef KEY
  hp->rope = (struct tsr_attn_rope){.struct_size = sizeof hp->rope, .n_rot = (int32_t)hp->n_rot,
                                    .neox = 1, .freq_base = hp->rope_base, .freq_scale = 1.0f};
  if (st == TSR_OK) st = tsr_qwen_rope_hints(h, m, hp->arch, &hp->rope);
  if (st != TSR_OK) return st;
  hp->moe.n_expert = n_expert;
  hp->moe.n_expert_used = n_used;
  /* describe() validated the ssm keys' consistency; the kernel's limit is ours */
  hp->dv = hp->hv ? inner / hp->hv : 0;
  if (hp->dk > TSR_DELTA_MAX_DIM || hp->dv > TSR_DELTA_MAX_DIM)
    return h->set_error(TSR_ERR_UNSUPPORTED, "%s: linear-attention head dims %u x %u exceed the "
                        "delta-rule kernel's %d", hp->arch, hp->dk, hp->dv, TSR_DELTA_MAX_DIM);
  hp->n_head = 0;
  for (int32_t il = 0; il < fw->n_layers && !hp->n_head; il++)
    if (fw->layers[il].kind == TSR_LAYER_FULL) {
      hp->n_head = fw->layers[il].n_head;
      hp->n_head_kv = fw->layers[il].n_head_kv;
      hp->head_dim = fw->layers[il].head_dim_k;
    }
  if (hp->n_nextn >= (uint32_t)fw->n_layers)
    return h->set_error(TSR_ERR_FORMAT, "%s: no trunk layers", hp->arch);
  return TSR_OK;
}

#define W(name) tsr_qwen_layer_weight(h, fw, il, name)

/* Gated full attention: q_proj holds [q_h | gate_h] per head; q and k are
** RMS-normalised per head, RoPE'd on their first n_rot dims (NeoX pairs),
** and the attention output is gated by sigmoid(gate) before o_proj. */
static struct tsr_tensor *gated_attention(const struct tsr_host *h, struct tsr_arch_forward *fw,
                                          const struct qwen35_hparams *hp, int il,
                                          struct tsr_tensor *x) {
  struct tsr_graph *g = fw->g;
  const int64_t n = fw->n_tokens, hd = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv;
  struct tsr_tensor *qg =
      h->graph->reshape(g, tsr_qwen_linear(h, fw, il, "attn_q", x), 3, (int64_t[]){2 * hd, nh, n});
  if (!qg) return NULL;
  struct tsr_tensor_info qi;
  h->graph->tensor_info(qg, &qi);
  const size_t f = sizeof(float);
  const int64_t half[3] = {hd, nh, n};
  const size_t nb[3] = {f, qi.nb[1], qi.nb[2]};
  struct tsr_tensor *q = h->graph->view(g, qg, 3, half, nb, 0);
  struct tsr_tensor *gate = h->graph->view(g, qg, 3, half, nb, (size_t)hd * f);
  struct tsr_tensor *k =
      h->graph->reshape(g, tsr_qwen_linear(h, fw, il, "attn_k", x), 3, (int64_t[]){hd, nkv, n});
  struct tsr_tensor *v =
      h->graph->reshape(g, tsr_qwen_linear(h, fw, il, "attn_v", x), 3, (int64_t[]){hd, nkv, n});
  q = h->graph->rms_norm(g, q, W("attn_q_norm.weight"), hp->eps);
  k = h->graph->rms_norm(g, k, W("attn_k_norm.weight"), hp->eps);
  /* Qwen3.5's interleaved M-RoPE is plain partial NeoX RoPE for text: all
  ** three position components are the token position */
  q = h->arch->attn_rope(fw, il, &hp->rope, q, false);
  k = h->arch->attn_rope(fw, il, &hp->rope, k, true);
  struct tsr_layer_desc desc = {
      .struct_size = sizeof desc, .layer = il, .kind = TSR_LAYER_FULL, .n_head = (int32_t)nh,
      .n_head_kv = (int32_t)nkv, .head_dim_k = (int32_t)hd, .head_dim_v = (int32_t)hd,
      .k_codec = "f32", .v_codec = "f32", .backend = "cpu"};
  struct tsr_attn_call call = {
      .struct_size = sizeof call, .layer = &desc, .q = h->graph->permute(g, q, 0, 2, 1, 3),
      .k = h->graph->permute(g, k, 0, 2, 1, 3), .v = h->graph->permute(g, v, 0, 2, 1, 3),
      .q_pos = fw->positions, .kv_pos = fw->positions, .scale = 1.0f / sqrtf((float)hd),
      .causal = true, .rope = &hp->rope};
  if (!call.q || !call.k || !call.v) return NULL;
  /* with a cache: write this batch's k/v, attend over every cell of the sequence */
  if (fw->kv && h->arch->kv_attend(fw, il, call.k, call.v, &call) != TSR_OK) return NULL;
  struct tsr_tensor *o = h->arch->attn_build(fw, il, &call); /* [hd, nh, n] */
  o = h->graph->mul(g, o, h->graph->unary(g, gate, 2 /* sigmoid */));
  o = h->graph->reshape(g, o, 2, (int64_t[]){hd * nh, n});
  return tsr_qwen_linear(h, fw, il, "attn_output", o);
}

/* Gated DeltaNet: qkv -> causal depthwise conv -> SiLU -> split; q and k
** L2-normalised per head, q scaled by dk^-1/2; beta = sigmoid(b), decay
** g = ssm_a·softplus(a + dt_bias) (ssm_a = -exp(A_log)); the delta rule per
** value head (key heads tiled over the value heads, the GGUF's order); then
** RMSNorm(o; ssm_norm) ⊙ silu(z) per head and out_proj. */
static struct tsr_tensor *gated_deltanet(const struct tsr_host *h, struct tsr_arch_forward *fw,
                                         const struct tsr_qwen_ops *ops,
                                         const struct qwen35_hparams *hp, int il,
                                         struct tsr_tensor *x) {
  struct tsr_graph *g = fw->g;
  const int64_t n = fw->n_tokens, dk = hp->dk, hk = hp->hk, dv = hp->dv, hv = hp->hv;
  const int64_t n_ch = 2 * hk * dk + hv * dv;
  const size_t f = sizeof(float);
  struct tsr_tensor *qkv = tsr_qwen_linear(h, fw, il, "attn_qkv", x); /* [n_ch, n] */
  struct tsr_tensor *z = tsr_qwen_linear(h, fw, il, "attn_gate", x);  /* [hv*dv, n] */
  struct tsr_tensor *b = tsr_qwen_linear(h, fw, il, "ssm_beta", x);   /* [hv, n] */
  struct tsr_tensor *a = tsr_qwen_linear(h, fw, il, "ssm_alpha", x);  /* [hv, n] */
  struct tsr_tensor *conv_w = W("ssm_conv1d.weight");
  if (!qkv || !conv_w) return NULL;
  /* with a cache: the state slot (layout at the top of this file) */
  struct tsr_tensor *conv_hist = NULL, *s_state = NULL, *conv_ckpt = NULL, *s_ckpt = NULL;
  if (fw->kv) {
    const int64_t k1 = hp->conv_kernel - 1, n_conv = k1 * n_ch, n_slot = n_conv + hv * dk * dv;
    struct tsr_tensor *slot = h->arch->kv_state(fw, il, n_slot);
    if (!slot) return NULL;
    conv_hist = h->graph->view(g, slot, 2, (int64_t[]){k1, n_ch}, (size_t[]){f, (size_t)k1 * f}, 0);
    s_state =
        h->graph->view(g, slot, 3, (int64_t[]){dv, hv, dk},
                       (size_t[]){f, (size_t)dv * f, (size_t)(dv * hv) * f}, (size_t)n_conv * f);
    if (!conv_hist || !s_state) return NULL;
    /* a speculation step: the state after each token, one slot image a row */
    struct tsr_tensor *ckpt = h->arch->kv_checkpoints(fw, il, n_slot);
    if (ckpt) {
      const size_t rb = (size_t)n_slot * f;
      conv_ckpt = h->graph->view(g, ckpt, 3, (int64_t[]){k1, n_ch, n},
                                 (size_t[]){f, (size_t)k1 * f, rb}, 0);
      s_ckpt = h->graph->view(g, ckpt, 4, (int64_t[]){dv, hv, dk, n},
                              (size_t[]){f, (size_t)dv * f, (size_t)(dv * hv) * f, rb},
                              (size_t)n_conv * f);
      if (!conv_ckpt || !s_ckpt) return NULL;
    }
  }
  struct tsr_tensor *conv_src[5] = {qkv, conv_w, conv_hist, conv_hist, conv_ckpt};
  struct tsr_tensor *mixed = h->graph->custom_op(g, ops->conv1d, 2, (int64_t[]){n_ch, n}, conv_src,
                                                 conv_ckpt ? 5 : conv_hist ? 4 : 2, NULL, 0);
  mixed = h->graph->unary(g, mixed, 1 /* silu */);
  const size_t row = (size_t)n_ch * f;
  const size_t qk_nb[3] = {f, (size_t)dk * f, row};
  struct tsr_tensor *q = h->graph->view(g, mixed, 3, (int64_t[]){dk, hk, n}, qk_nb, 0);
  struct tsr_tensor *k =
      h->graph->view(g, mixed, 3, (int64_t[]){dk, hk, n}, qk_nb, (size_t)(hk * dk) * f);
  struct tsr_tensor *v = h->graph->view(g, mixed, 3, (int64_t[]){dv, hv, n},
                                        (size_t[]){f, dv * f, row}, (size_t)(2 * hk * dk) * f);
  q = h->graph->scale(g, h->graph->l2_norm(g, q, 1e-6f), 1.0f / sqrtf((float)dk));
  k = h->graph->l2_norm(g, k, 1e-6f);
  struct tsr_tensor *beta = h->graph->unary(g, b, 2 /* sigmoid */);
  struct tsr_tensor *decay =
      h->graph->unary(g, h->graph->add(g, a, W("ssm_dt.bias")), 3 /* softplus */);
  decay = h->graph->mul(g, decay, W("ssm_a"));
  /* from the carried state, and back into it */
  struct tsr_tensor *delta_src[7] = {q, k, v, decay, beta, s_state, s_ckpt};
  for (int i = 0; i < 5; i++)
    if (!delta_src[i]) return NULL;
  const int32_t params[2] = {TSR_DELTA_TILED, s_state != NULL /* write the state back */};
  struct tsr_tensor *od = h->graph->custom_op(g, ops->delta_rule, 3, (int64_t[]){dv, hv, n + dk},
                                              delta_src, s_ckpt ? 7 : s_state ? 6 : 5, params, 2);
  if (!od) return NULL;
  struct tsr_tensor_info oi;
  h->graph->tensor_info(od, &oi);
  /* the outputs are the first n steps; the final state after them is in the slot already */
  struct tsr_tensor *o =
      h->graph->view(g, od, 3, (int64_t[]){dv, hv, n}, (size_t[]){oi.nb[0], oi.nb[1], oi.nb[2]}, 0);
  o = h->graph->rms_norm(g, o, W("ssm_norm.weight"), hp->eps);
  o = h->graph->mul(
      g, o, h->graph->reshape(g, h->graph->unary(g, z, 1 /* silu */), 3, (int64_t[]){dv, hv, n}));
  o = h->graph->reshape(g, o, 2, (int64_t[]){hv * dv, n});
  return tsr_qwen_linear(h, fw, il, "ssm_out", o);
}

/* Routed experts plus the shared expert, gated by sigmoid(w_sg·x). */
static struct tsr_tensor *moe_ffn(const struct tsr_host *h, struct tsr_arch_forward *fw,
                                  const struct qwen35_hparams *hp, int il, struct tsr_tensor *x) {
  struct tsr_graph *g = fw->g;
  struct tsr_tensor *routed = tsr_qwen_moe_block(h, fw, &hp->moe, il, x);
  char name[64];
  snprintf(name, sizeof name, "blk.%d.ffn_gate_inp_shexp.weight", il);
  if (!h->gguf->has_weight(fw->model, name)) return routed;
  struct tsr_tensor *shared = tsr_qwen_mlp_block(h, fw, il, "_shexp", x);
  struct tsr_tensor *gate_logit = tsr_qwen_linear(h, fw, il, "ffn_gate_inp_shexp", x); /* [1, n] */
  struct tsr_tensor *gate = h->graph->unary(g, gate_logit, 2 /* sigmoid */);
  return h->graph->add(g, routed, h->graph->mul(g, shared, gate));
}

/* The conv kernel reads its weight as f32 {K, channels}; the converter
** keeps it f32 whatever the outtype. */
static tsr_status check_conv_weight(const struct tsr_host *h, struct tsr_arch_forward *fw,
                                    const struct qwen35_hparams *hp, int il) {
  char name[64];
  snprintf(name, sizeof name, "blk.%d.ssm_conv1d.weight", il);
  struct tsr_tensor *w = h->graph->weight(fw->g, fw->model, name);
  if (!w) return TSR_ERR_FORMAT; /* the graph holds the error naming it */
  struct tsr_tensor_info wi;
  h->graph->tensor_info(w, &wi);
  const int64_t n_ch = 2 * (int64_t)hp->hk * hp->dk + (int64_t)hp->hv * hp->dv;
  if (wi.dtype != 0 /* f32 */ || wi.ne[0] != hp->conv_kernel || wi.ne[1] != n_ch)
    return h->set_error(TSR_ERR_FORMAT, "%s: want f32 {%u, %lld}, have dtype %d {%lld, %lld}",
                        name, hp->conv_kernel, (long long)n_ch, wi.dtype, (long long)wi.ne[0],
                        (long long)wi.ne[1]);
  return TSR_OK;
}

/* The LM head: the NextN block's own (layer il, when it has one), else
** output.weight, else the tied embedding. */
static const char *lm_head(const struct tsr_host *h, const struct tsr_arch_forward *fw, int il) {
  static __thread char own[64];
  snprintf(own, sizeof own, "blk.%d.nextn.shared_head_head.weight", il);
  if (il >= 0 && h->gguf->has_weight(fw->model, own)) return own;
  return h->gguf->has_weight(fw->model, "output.weight") ? "output.weight" : "token_embd.weight";
}

/* Whether the host asks for every token's hidden row (ABI 2.4). */
static bool every_row(const struct tsr_arch_forward *fw) {
  return fw->struct_size >= offsetof(struct tsr_arch_forward, hidden_every_row) + sizeof(int32_t) &&
         fw->hidden_every_row;
}

tsr_status tsr_qwen35_build(void *ctx, const struct tsr_host *h, struct tsr_arch_forward *fw) {
  const struct tsr_qwen_ops *ops = ctx;
  struct qwen35_hparams hp;
  tsr_status st = read_hparams(h, fw, &hp);
  if (st != TSR_OK) return st;
  struct tsr_graph *g = fw->g;
  struct tsr_tensor *x =
      h->graph->get_rows(g, h->graph->weight(g, fw->model, "token_embd.weight"), fw->tokens);
  fw->embed = x;
  /* the NextN block(s) after the trunk belong to the speculator, not this pass */
  const int n_trunk = fw->n_layers - (int)hp.n_nextn;
  for (int il = 0; il < n_trunk; il++) {
    if (fw->layers[il].kind == TSR_LAYER_LINEAR && (st = check_conv_weight(h, fw, &hp, il)))
      return st;
    struct tsr_tensor *a = h->graph->rms_norm(g, x, W("attn_norm.weight"), hp.eps);
    a = fw->layers[il].kind == TSR_LAYER_LINEAR ? gated_deltanet(h, fw, ops, &hp, il, a)
                                                : gated_attention(h, fw, &hp, il, a);
    x = h->graph->add(g, x, a);
    /* llama.cpp's name for the pre-FFN norm in the hybrids */
    struct tsr_tensor *m = h->graph->rms_norm(g, x, W("post_attention_norm.weight"), hp.eps);
    x = h->graph->add(
        g, x, hp.moe.n_expert ? moe_ffn(h, fw, &hp, il, m) : tsr_qwen_mlp_block(h, fw, il, "", m));
    if (fw->hidden) fw->hidden[il] = x;
  }
  struct tsr_tensor *out_norm = h->graph->weight(g, fw->model, "output_norm.weight");
  if (every_row(fw)) { /* the norm is row-wise: the selected rows come out the same */
    fw->hidden_final = x = h->graph->rms_norm(g, x, out_norm, hp.eps);
    x = tsr_arch_output_rows(h, fw, x);
  } else {
    fw->hidden_final = x = h->graph->rms_norm(g, tsr_arch_output_rows(h, fw, x), out_norm, hp.eps);
  }
  fw->logits = h->graph->mat_mul(g, h->graph->weight(g, fw->model, lm_head(h, fw, -1)), x);
  /* on failure the graph holds the first builder error and its message */
  return fw->logits ? TSR_OK : TSR_ERR_INVALID_ARG;
}

/* The NextN (MTP) block, layer il = the first after the trunk:
**   x = eh_proj · [enorm(E[t]) ; hnorm(h)], then one trunk-style decoder
**   layer (gated attention, dense or MoE FFN), shared_head_norm (else
**   output_norm) and the LM head (its own shared_head_head, else the trunk's).
** The embedding may be the block's own (nextn.embed_tokens). */
tsr_status tsr_qwen35_build_nextn(void *ctx, const struct tsr_host *h,
                                  struct tsr_arch_forward *fw) {
  (void)ctx;
  struct qwen35_hparams hp;
  tsr_status st = read_hparams(h, fw, &hp);
  if (st != TSR_OK) return st;
  if (!hp.n_nextn)
    return h->set_error(TSR_ERR_UNSUPPORTED, "the model has no NextN block (%s."
                        "nextn_predict_layers is absent or 0)", hp.arch);
  if (!fw->nextn_hidden)
    return h->set_error(TSR_ERR_INVALID_ARG, "NextN: no trunk hidden state given");
  struct tsr_graph *g = fw->g;
  const int il = fw->n_layers - (int)hp.n_nextn;
  char own_embd[64];
  snprintf(own_embd, sizeof own_embd, "blk.%d.nextn.embed_tokens.weight", il);
  struct tsr_tensor *e = h->graph->get_rows(
      g,
      h->graph->weight(g, fw->model,
                       h->gguf->has_weight(fw->model, own_embd) ? own_embd : "token_embd.weight"),
      fw->tokens);
  e = h->graph->rms_norm(g, e, W("nextn.enorm.weight"), hp.eps);
  struct tsr_tensor *hh = h->graph->rms_norm(g, fw->nextn_hidden, W("nextn.hnorm.weight"), hp.eps);
  struct tsr_tensor *x =
      h->graph->mat_mul(g, W("nextn.eh_proj.weight"), h->graph->concat(g, e, hh, 0));
  struct tsr_tensor *a = h->graph->rms_norm(g, x, W("attn_norm.weight"), hp.eps);
  x = h->graph->add(g, x, gated_attention(h, fw, &hp, il, a));
  struct tsr_tensor *m = h->graph->rms_norm(g, x, W("post_attention_norm.weight"), hp.eps);
  x = h->graph->add(
      g, x, hp.moe.n_expert ? moe_ffn(h, fw, &hp, il, m) : tsr_qwen_mlp_block(h, fw, il, "", m));
  char norm[64];
  snprintf(norm, sizeof norm, "blk.%d.nextn.shared_head_norm.weight", il);
  x = h->graph->rms_norm(
      g, tsr_arch_output_rows(h, fw, x),
      h->graph->weight(g, fw->model,
                       h->gguf->has_weight(fw->model, norm) ? norm : "output_norm.weight"),
      hp.eps);
  fw->hidden_final = x; /* what a deeper draft step takes as its hidden state */
  fw->logits = h->graph->mat_mul(g, h->graph->weight(g, fw->model, lm_head(h, fw, il)), x);
  return fw->logits ? TSR_OK : TSR_ERR_INVALID_ARG;
}
