/*
** The Gemma 4 forward pass (dense, MoE, per-layer-input E2B/E4B), read top
** to bottom like transformers' Gemma4TextModel:
**
**   h = embed[id] * sqrt(H)
**   per layer: h += post_attn_norm(Attn(attn_norm(h)))
**              h += post_ffw_norm(MLP(ffn_norm(h)) [+ MoE beside it])
**              h += post_norm(proj(gelu(inp_gate(h)) * ple[l]))   (E2B/E4B)
**              h *= layer_output_scale
**   logits = softcap(embed . output_norm(h))
**
** Norms multiply by w itself (the converter adds no +1). Attention has
** scale 1 (q and k are RMS-normed per head); V is normed without a weight.
** Sliding layers use NeoX RoPE over the whole head with freq_base_swa; full
** layers rotate the whole head with freq_base, and rope_freqs divides the
** angles of the pairs "proportional" RoPE leaves still by 1e30.
** With a KV cache (fw->kv) each attention layer writes the batch's K/V into
** its pool (sliding layers: the ring) and attends over every cell of the
** sequence (host->arch->kv_attend); KV-shared layers read their source's cells.
** Without one, attention sees the batch alone.
*/
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gemma4.h"

struct g4_hparams {
  bool assistant; /* gemma4-assistant: a drafter reading a target's K/V */
  uint32_t n_embd_out, centroid_top_k; /* assistant: target hidden size; 0: no ordered head */
  uint32_t n_embd, n_expert, n_expert_used, n_embd_per_layer;
  uint32_t n_rot, n_rot_swa; /* rope.dimension_count(_swa); 0 when absent */
  float eps, rope_base, rope_base_swa, softcap;
  int32_t n_ctx_train; /* context_length; 0 when absent */
  const char *arch;    /* general.architecture, its keys' prefix */
};

struct g4_kv {
  struct tsr_tensor *k, *v; /* [D, N, Hkv] views, after norm and RoPE */
};

static tsr_status read_hparams(const struct tsr_host *h, const struct tsr_gguf *m,
                               struct g4_hparams *hp) {
  const char *arch;
  char key[96];
  memset(hp, 0, sizeof *hp);
  tsr_status st = h->gguf->get_str(m, "general.architecture", &arch);
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, arch), key)
  if (st == TSR_OK && strcmp(arch, "gemma4") && strcmp(arch, "gemma4-assistant"))
    return h->set_error(TSR_ERR_UNSUPPORTED, "arch_gemma4: forward pass of '%s' is not built in "
                        "this version (gemma4 and gemma4-assistant are)", arch);
  hp->assistant = st == TSR_OK && !strcmp(arch, "gemma4-assistant");
  hp->arch = st == TSR_OK ? arch : NULL;
  if (st == TSR_OK && hp->assistant) {
    st = h->gguf->get_u32(m, KEY("embedding_length_out"), &hp->n_embd_out);
    if (st == TSR_OK && h->gguf->has_key(m, KEY("centroid_intermediate_top_k")))
      st = h->gguf->get_u32(m, key, &hp->centroid_top_k);
  }
  if (st == TSR_OK) st = h->gguf->get_u32(m, KEY("embedding_length"), &hp->n_embd);
  if (st == TSR_OK) st = h->gguf->get_f32(m, KEY("attention.layer_norm_rms_epsilon"), &hp->eps);
  if (st == TSR_OK) st = h->gguf->get_f32(m, KEY("rope.freq_base"), &hp->rope_base);
  /* llama.cpp's default when the converter saw no sliding rope_theta */
  hp->rope_base_swa = 10000.0f;
  if (st == TSR_OK && h->gguf->has_key(m, KEY("rope.freq_base_swa")))
    st = h->gguf->get_f32(m, key, &hp->rope_base_swa);
  if (st == TSR_OK && h->gguf->has_key(m, KEY("rope.dimension_count")))
    st = h->gguf->get_u32(m, key, &hp->n_rot);
  if (st == TSR_OK && h->gguf->has_key(m, KEY("rope.dimension_count_swa")))
    st = h->gguf->get_u32(m, key, &hp->n_rot_swa);
  uint32_t n_ctx = 0;
  if (st == TSR_OK && h->gguf->has_key(m, KEY("context_length")))
    st = h->gguf->get_u32(m, key, &n_ctx);
  hp->n_ctx_train = n_ctx > INT32_MAX ? INT32_MAX : (int32_t)n_ctx;
  if (st == TSR_OK && h->gguf->has_key(m, KEY("final_logit_softcapping")))
    st = h->gguf->get_f32(m, key, &hp->softcap);
  if (st == TSR_OK && h->gguf->has_key(m, KEY("embedding_length_per_layer_input")))
    st = h->gguf->get_u32(m, key, &hp->n_embd_per_layer);
  if (st == TSR_OK && h->gguf->has_key(m, KEY("expert_count"))) {
    st = h->gguf->get_u32(m, key, &hp->n_expert);
    if (st == TSR_OK) st = h->gguf->get_u32(m, KEY("expert_used_count"), &hp->n_expert_used);
  }
#undef KEY
  return st;
}

struct tsr_tensor *gemma_layer_weight(const struct tsr_host *h, struct tsr_arch_forward *fw,
                                      int il, const char *name) {
  char full[96];
  snprintf(full, sizeof full, "blk.%d.%s", il, name);
  return h->graph->weight(fw->g, fw->model, full);
}

static bool has_layer_weight(const struct tsr_host *h, struct tsr_arch_forward *fw, int il,
                             const char *name) {
  char full[96];
  snprintf(full, sizeof full, "blk.%d.%s", il, name);
  return h->gguf->has_weight(fw->model, full);
}

struct tsr_tensor *gemma_norm(const struct tsr_host *h, struct tsr_arch_forward *fw, float eps,
                              int il, const char *name, struct tsr_tensor *x) {
  return h->graph->rms_norm(fw->g, x, gemma_layer_weight(h, fw, il, name), eps);
}

struct tsr_tensor *gemma_linear(const struct tsr_host *h, struct tsr_arch_forward *fw, int il,
                                const char *name, struct tsr_tensor *x) {
  return h->graph->mat_mul(fw->g, gemma_layer_weight(h, fw, il, name), x);
}

/* NeoX RoPE with the layer kind's base; full layers carry rope_freqs. Over
** the whole head (every released Gemma 4) it rounds as transformers does
** (rope_gemma4.c says why); a partial rotary falls back to the core's.
** rope_op points at the rounding op's id (NULL: not registered). */
static struct tsr_attn_rope layer_rope(const struct tsr_host *h, struct tsr_arch_forward *fw,
                                       const struct g4_hparams *hp, const int32_t *rope_op,
                                       const struct tsr_arch_layer *L) {
  const bool swa = L->kind == TSR_LAYER_SLIDING;
  uint32_t n_rot = swa ? hp->n_rot_swa : hp->n_rot;
  if (!n_rot) n_rot = (uint32_t)L->head_dim_k;
  struct tsr_attn_rope r = {.struct_size = sizeof r, .n_rot = (int32_t)n_rot, .neox = 1,
                            .freq_base = swa ? hp->rope_base_swa : hp->rope_base,
                            .freq_scale = 1.0f, .n_ctx_train = hp->n_ctx_train,
                            .model = fw->model, .arch = hp->arch};
  if (!swa && h->gguf->has_weight(fw->model, "rope_freqs.weight"))
    r.freq_factors = h->graph->weight(fw->g, fw->model, "rope_freqs.weight");
  if (rope_op && *rope_op >= 0 && n_rot == (uint32_t)L->head_dim_k) {
    r.rotate = gemma4_rope_rotate;
    r.rotate_ctx = (void *)(uintptr_t)rope_op;
  }
  return r;
}

/* Self-attention of layer il. A layer that owns its K/V stores them in
** kv[il]; a KV-shared layer reads its source layer's. */
static struct tsr_tensor *attention_block(const struct tsr_host *h, struct tsr_arch_forward *fw,
                                          const struct g4_hparams *hp, const int32_t *rope_op,
                                          int il, struct g4_kv *kv, struct tsr_tensor *x) {
  struct tsr_graph *g = fw->g;
  const struct tsr_arch_layer *L = &fw->layers[il];
  const int64_t n = fw->n_tokens, hd = L->head_dim_k, nh = L->n_head, nkv = L->n_head_kv;
  const struct tsr_attn_rope rope = layer_rope(h, fw, hp, rope_op, L);
  struct tsr_tensor *q =
      h->graph->reshape(g, gemma_linear(h, fw, il, "attn_q.weight", x), 3, (int64_t[]){hd, nh, n});
  /* RoPE at each token's position, or as the attention places q and k itself */
  q = h->arch->attn_rope(fw, il, &rope, gemma_norm(h, fw, hp->eps, il, "attn_q_norm.weight", q),
                         false);
  q = h->graph->permute(g, q, 0, 2, 1, 3);

  if (L->kv_shared_from < 0) {
    /* a drafter layer reads the target's last layer of its kind (host-filled) */
    const int pool = L->kind == TSR_LAYER_SLIDING;
    kv[il].k = fw->target_k[pool];
    kv[il].v = fw->target_v[pool];
  } else if (L->kv_shared_from > 0) {
    kv[il] = kv[L->kv_shared_from - 1];
  } else {
    struct tsr_tensor *k_raw = h->graph->reshape(g, gemma_linear(h, fw, il, "attn_k.weight", x), 3,
                                                 (int64_t[]){hd, nkv, n});
    /* k_eq_v full layers have no attn_v: V is the raw K projection */
    struct tsr_tensor *v = has_layer_weight(h, fw, il, "attn_v.weight")
                               ? h->graph->reshape(g, gemma_linear(h, fw, il, "attn_v.weight", x),
                                                   3, (int64_t[]){hd, nkv, n})
                               : k_raw;
    struct tsr_tensor *k = h->arch->attn_rope(
        fw, il, &rope, gemma_norm(h, fw, hp->eps, il, "attn_k_norm.weight", k_raw), true);
    v = h->graph->rms_norm(g, v, NULL, hp->eps);
    kv[il].k = h->graph->permute(g, k, 0, 2, 1, 3);
    kv[il].v = h->graph->permute(g, v, 0, 2, 1, 3);
  }

  struct tsr_layer_desc desc = {
      .struct_size = sizeof desc, .layer = il, .kind = L->kind, .n_head = L->n_head,
      .n_head_kv = L->n_head_kv, .head_dim_k = L->head_dim_k, .head_dim_v = L->head_dim_v,
      .window = L->window, .k_codec = "f32", .v_codec = "f32", .backend = "cpu"};
  struct tsr_attn_call call = {
      .struct_size = sizeof call, .layer = &desc, .q = q, .k = kv[il].k, .v = kv[il].v,
      .q_pos = fw->positions, .kv_pos = fw->positions, .scale = 1.0f, .causal = true,
      .window = L->kind == TSR_LAYER_SLIDING ? L->window : 0, .rope = &rope};
  if (L->kv_shared_from < 0) {
    /* transformers' drafter, its query at the target's next position N, sees
    ** the last window + 1 of the target's sliding keys (its flipped
    ** bidirectional mask): N - p < window + 2 */
    call.kv_pos = fw->target_kv_pos[L->kind == TSR_LAYER_SLIDING];
    if (call.window) call.window += 2;
    if (!q || !call.k || !call.v || !call.kv_pos) {
      h->graph->fail(g, TSR_ERR_INVALID_ARG, "arch_gemma4: drafter layer %d has no target "
                     "K/V of its kind (the host fills target_k/v/kv_pos)", il);
      return NULL;
    }
    struct tsr_tensor *o = h->arch->attn_build(fw, il, &call);
    o = h->graph->reshape(g, o, 2, (int64_t[]){L->head_dim_v * nh, n});
    return gemma_linear(h, fw, il, "attn_output.weight", o);
  }
  if (!q || !call.k || !call.v) return NULL;
  /* with a cache: store what attention consumes (normed, rotated K; normed V)
  ** and attend over every cell of the sequence; a shared layer stores nothing
  ** and the host hands it its source's cells */
  if (fw->kv && h->arch->kv_attend(fw, il, L->kv_shared_from > 0 ? NULL : call.k,
                                   L->kv_shared_from > 0 ? NULL : call.v, &call) != TSR_OK)
    return NULL;
  struct tsr_tensor *o = h->arch->attn_build(fw, il, &call);
  if (!o) return NULL;
  o = h->graph->reshape(g, o, 2, (int64_t[]){L->head_dim_v * nh, n});
  return gemma_linear(h, fw, il, "attn_output.weight", o);
}

/* down(gelu_tanh(gate . x) * up . x) */
struct tsr_tensor *gemma_mlp_block(const struct tsr_host *h, struct tsr_arch_forward *fw, int il,
                                   struct tsr_tensor *x) {
  struct tsr_tensor *gate = gemma_linear(h, fw, il, "ffn_gate.weight", x);
  struct tsr_tensor *up = gemma_linear(h, fw, il, "ffn_up.weight", x);
  return gemma_linear(h, fw, il, "ffn_down.weight",
                      h->graph->glu(fw->g, gate, up, 1 /* geglu */, false));
}

/* The routed experts beside the dense MLP. The router reads the raw
** residual r: p = softmax(W . (rms(r) * scale / sqrt(H))); the top k are
** renormalised and multiplied by their expert's scale. The experts read
** pre_ffw_norm_2(r). */
static struct tsr_tensor *moe_block(const struct tsr_host *h, struct tsr_arch_forward *fw,
                                    const struct g4_hparams *hp, int il, struct tsr_tensor *r) {
  struct tsr_graph *g = fw->g;
  const int64_t n = fw->n_tokens, k = hp->n_expert_used, e = hp->n_expert, H = hp->n_embd;
  struct tsr_tensor *ri =
      h->graph->rms_norm(g, r, gemma_layer_weight(h, fw, il, "ffn_gate_inp.scale"), hp->eps);
  ri = h->graph->scale(g, ri, 1.0f / sqrtf((float)H));
  struct tsr_tensor *logits = gemma_linear(h, fw, il, "ffn_gate_inp.weight", ri); /* [e, n] */
  struct tsr_tensor *ids =
      h->graph->top_k(g, h->graph->softmax(g, logits, NULL, 1.0f), (int32_t)k); /* [k, n] */
  /* the renormalised top-k probabilities are the softmax of the chosen logits */
  struct tsr_tensor *chosen = h->graph->get_rows(
      g, h->graph->reshape(g, logits, 3, (int64_t[]){1, e, n}), ids); /* [1, k, n] */
  struct tsr_tensor *w =
      h->graph->softmax(g, h->graph->reshape(g, chosen, 2, (int64_t[]){k, n}), NULL, 1.0f);
  struct tsr_tensor *scale_tab = h->graph->reshape(
      g, gemma_layer_weight(h, fw, il, "ffn_down_exps.scale"), 2, (int64_t[]){1, e});
  struct tsr_tensor *flat_ids = h->graph->reshape(g, ids, 1, (int64_t[]){k * n});
  struct tsr_tensor *expert_scale =
      h->graph->reshape(g, h->graph->get_rows(g, scale_tab, flat_ids), 2, (int64_t[]){k, n});
  w = h->graph->reshape(g, h->graph->mul(g, w, expert_scale), 3, (int64_t[]){1, k, n});

  struct tsr_tensor *y = gemma_norm(h, fw, hp->eps, il, "pre_ffw_norm_2.weight", r);
  y = h->graph->reshape(g, y, 3, (int64_t[]){H, 1, n});
  struct tsr_tensor *gate_up = h->graph->mat_mul_id(
      g, gemma_layer_weight(h, fw, il, "ffn_gate_up_exps.weight"), y, ids);       /* [2I,k,n] */
  struct tsr_tensor *act = h->graph->glu(g, gate_up, NULL, 1 /* geglu */, false); /* [I,k,n] */
  struct tsr_tensor *down = h->graph->mat_mul_id(
      g, gemma_layer_weight(h, fw, il, "ffn_down_exps.weight"), act, ids); /* [H,k,n] */
  struct tsr_tensor *weighted = h->graph->mul(g, down, w);
  return weighted ? tsr_graph_sum_slots(h->graph, g, weighted) : NULL; /* over the k experts */
}

/* Per-layer inputs (E2B/E4B), [P, L, n]:
** (rms_norm(W_proj . e / sqrt(H)) + E_ple[id] * sqrt(P)) / sqrt(2). */
static struct tsr_tensor *per_layer_inputs(const struct tsr_host *h, struct tsr_arch_forward *fw,
                                           const struct g4_hparams *hp, struct tsr_tensor *e) {
  struct tsr_graph *g = fw->g;
  const int64_t P = hp->n_embd_per_layer, L = fw->n_layers, n = fw->n_tokens;
  struct tsr_tensor *tok = h->graph->get_rows(
      g, h->graph->weight(g, fw->model, "per_layer_token_embd.weight"), fw->tokens);
  tok = h->graph->reshape(g, h->graph->scale(g, tok, sqrtf((float)P)), 3, (int64_t[]){P, L, n});
  struct tsr_tensor *proj =
      h->graph->mat_mul(g, h->graph->weight(g, fw->model, "per_layer_model_proj.weight"), e);
  proj = h->graph->reshape(g, h->graph->scale(g, proj, 1.0f / sqrtf((float)hp->n_embd)), 3,
                           (int64_t[]){P, L, n});
  proj = h->graph->rms_norm(g, proj, h->graph->weight(g, fw->model, "per_layer_proj_norm.weight"),
                            hp->eps);
  return h->graph->scale(g, h->graph->add(g, proj, tok), 1.0f / sqrtf(2.0f));
}

static struct tsr_tensor *per_layer_block(const struct tsr_host *h, struct tsr_arch_forward *fw,
                                          const struct g4_hparams *hp, int il,
                                          struct tsr_tensor *ple, struct tsr_tensor *x) {
  struct tsr_graph *g = fw->g;
  const int64_t P = hp->n_embd_per_layer, n = fw->n_tokens;
  struct tsr_tensor_info info;
  h->graph->tensor_info(ple, &info);
  struct tsr_tensor *pl = h->graph->cont(g, h->graph->view(g, ple, 2, (int64_t[]){P, n},
                                                           (size_t[]){info.nb[0], info.nb[2]},
                                                           (size_t)il * info.nb[1]));
  struct tsr_tensor *gate =
      h->graph->unary(g, gemma_linear(h, fw, il, "inp_gate.weight", x), 0 /* gelu */);
  struct tsr_tensor *y = gemma_linear(h, fw, il, "proj.weight", h->graph->mul(g, gate, pl));
  return gemma_norm(h, fw, hp->eps, il, "post_norm.weight", y);
}

/* One decoder layer: attention, MLP (+ MoE beside it), per-layer input, the layer's scale. */
static struct tsr_tensor *decoder_layer(const struct tsr_host *h, struct tsr_arch_forward *fw,
                                        const struct g4_hparams *hp, const int32_t *rope_op,
                                        int il, struct g4_kv *kv, struct tsr_tensor *ple,
                                        struct tsr_tensor *x) {
  struct tsr_graph *g = fw->g;
  struct tsr_tensor *a = attention_block(h, fw, hp, rope_op, il, kv,
                                         gemma_norm(h, fw, hp->eps, il, "attn_norm.weight", x));
  x = h->graph->add(g, x, gemma_norm(h, fw, hp->eps, il, "post_attention_norm.weight", a));
  struct tsr_tensor *m = gemma_mlp_block(h, fw, il, gemma_norm(h, fw, hp->eps, il, "ffn_norm.weight", x));
  if (hp->n_expert && has_layer_weight(h, fw, il, "ffn_gate_inp.weight")) {
    m = gemma_norm(h, fw, hp->eps, il, "post_ffw_norm_1.weight", m);
    struct tsr_tensor *e = gemma_norm(h, fw, hp->eps, il, "post_ffw_norm_2.weight",
                                      moe_block(h, fw, hp, il, x));
    m = h->graph->add(g, m, e);
  }
  x = h->graph->add(g, x, gemma_norm(h, fw, hp->eps, il, "post_ffw_norm.weight", m));
  if (ple) x = h->graph->add(g, x, per_layer_block(h, fw, hp, il, ple, x));
  x = h->graph->mul(g, x, gemma_layer_weight(h, fw, il, "layer_output_scale.weight"));
  if (fw->hidden) fw->hidden[il] = x;
  return x;
}

/* The gemma4 assistant (transformers' Gemma4AssistantForCausalLM), one
** draft step per token at the target's next position:
**   x = pre_projection . [E_target[t] * sqrt(H_t) ; h_target]
**   the decoder layers, each on the target's K/V of its kind
**   hidden_final = post_projection . output_norm(x)     (the next step's h)
**   logits = the ordered-embedding head over E . output_norm(x), no softcap */
static tsr_status drafter_build(const struct tsr_host *h, struct tsr_arch_forward *fw,
                                const struct g4_hparams *hp, const struct gemma4_ops *ops) {
  if (!fw->target || !fw->nextn_hidden)
    return h->set_error(TSR_ERR_INVALID_ARG, "arch_gemma4: a gemma4-assistant drafter needs "
                        "its target model and the target's hidden state");
  struct tsr_graph *g = fw->g;
  struct tsr_tensor *e =
      h->graph->get_rows(g, h->graph->weight(g, fw->target, "token_embd.weight"), fw->tokens);
  e = h->graph->scale(g, e, sqrtf((float)hp->n_embd_out));
  struct tsr_tensor *x =
      h->graph->mat_mul(g, h->graph->weight(g, fw->model, "nextn.pre_projection.weight"),
                        h->graph->concat(g, e, fw->nextn_hidden, 0));
  struct g4_kv kv[GEMMA4_MAX_LAYERS] = {{0}};
  const int32_t *rope_op = ops ? &ops->rope : NULL;
  for (int il = 0; il < fw->n_layers; il++)
    x = decoder_layer(h, fw, hp, rope_op, il, kv, NULL, x);
  x = h->graph->rms_norm(g, x, h->graph->weight(g, fw->model, "output_norm.weight"), hp->eps);
  fw->hidden_final =
      h->graph->mat_mul(g, h->graph->weight(g, fw->model, "nextn.post_projection.weight"), x);
  struct tsr_tensor *logits =
      h->graph->mat_mul(g, h->graph->weight(g, fw->model, "token_embd.weight"), x);
  if (hp->centroid_top_k)
    logits = gemma4_ordered_logits(
        h, g, ops ? ops->ordered_logits : -1, logits,
        h->graph->mat_mul(g, h->graph->weight(g, fw->model, "masked_embd_centroids.weight"), x),
        h->graph->weight(g, fw->model, "masked_embd_ordering"), (int32_t)hp->centroid_top_k);
  fw->logits = logits;
  return fw->logits ? TSR_OK : TSR_ERR_INVALID_ARG;
}

tsr_status gemma4_build(void *ctx, const struct tsr_host *h, struct tsr_arch_forward *fw) {
  const struct gemma4_ops *ops = ctx;
  const int32_t *rope_op = ops ? &ops->rope : NULL; /* the rounding rope, or the core's */
  struct g4_hparams hp;
  tsr_status st = read_hparams(h, fw->model, &hp);
  if (st != TSR_OK) return st;
  if (fw->n_layers > GEMMA4_MAX_LAYERS)
    return h->set_error(TSR_ERR_UNSUPPORTED, "arch_gemma4: %d layers", fw->n_layers);
  for (int il = 0; il < fw->n_layers; il++) {
    const int32_t src = fw->layers[il].kv_shared_from;
    if ((src < 0) != hp.assistant || src > il)
      return h->set_error(TSR_ERR_UNSUPPORTED, "arch_gemma4: layer %d reads %s K/V (a drafter "
                          "reads its target's; a model its own earlier layers')", il,
                          src < 0 ? "a paired target model's" : "a later layer's");
  }
  if (hp.assistant) return drafter_build(h, fw, &hp, ops);
  struct tsr_graph *g = fw->g;
  struct tsr_tensor *emb = h->graph->weight(g, fw->model, "token_embd.weight");
  struct tsr_tensor *x =
      h->graph->scale(g, h->graph->get_rows(g, emb, fw->tokens), sqrtf((float)hp.n_embd));
  fw->embed = x;
  struct tsr_tensor *ple = NULL;
  if (hp.n_embd_per_layer > 0 && h->gguf->has_weight(fw->model, "per_layer_token_embd.weight"))
    ple = per_layer_inputs(h, fw, &hp, x);

  struct g4_kv kv[GEMMA4_MAX_LAYERS] = {{0}}; /* 8 KB */
  for (int il = 0; il < fw->n_layers; il++) x = decoder_layer(h, fw, &hp, rope_op, il, kv, ple, x);
  x = h->graph->rms_norm(g, tsr_arch_output_rows(h, fw, x),
                         h->graph->weight(g, fw->model, "output_norm.weight"), hp.eps);
  fw->hidden_final = x;
  const char *head =
      h->gguf->has_weight(fw->model, "output.weight") ? "output.weight" : "token_embd.weight";
  struct tsr_tensor *logits = h->graph->mat_mul(g, h->graph->weight(g, fw->model, head), x);
  if (logits && hp.softcap > 0) logits = h->graph->softcap(g, logits, hp.softcap);
  fw->logits = logits;
  /* on failure the graph holds the first builder error and its message */
  return fw->logits ? TSR_OK : TSR_ERR_INVALID_ARG;
}
