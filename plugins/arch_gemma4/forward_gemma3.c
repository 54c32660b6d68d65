/*
** The Gemma 3 forward pass, read top to bottom like transformers'
** Gemma3TextModel:
**
**   h = embed[id] * sqrt(H)
**   per layer: h += post_attn_norm(Attn(attn_norm(h)))
**              h += post_ffw_norm(MLP(ffn_norm(h)))
**   logits = embed . output_norm(h)            (tied head, no softcap)
**
** What differs from Gemma 4 (forward_gemma4.c):
** - Norms are Gemma's x * (1 + w); llama.cpp's converter stores 1 + w, so the
**   file's weight multiplies directly (transformers subtracts 1 on load and
**   adds it back in the norm).
** - Attention scales q.k by query_pre_attn_scalar^-1/2. The GGUF has no key for
**   it; llama.cpp implies head_dim, except on the 62-layer 27B, which uses
**   H / n_head. V has no norm. No logit softcaps.
** - NeoX RoPE over the whole head: base 10000 on sliding layers (implied, or
**   rope.freq_base_swa when present) and rope.freq_base on full ones, where
**   the larger models add linear scaling (rope.scaling.factor).
** With a KV cache (fw->kv) attention writes the batch's K/V into the cache
** (sliding layers: the ring) and attends over every cell of the sequence
** (host->arch->kv_attend); without one, over the batch alone.
*/
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gemma4.h"

struct g3_hparams {
  uint32_t n_embd, n_head, n_layer;
  float eps, rope_base, rope_base_swa;
  float rope_scale; /* full layers' position scale: 1 / rope.scaling.factor */
  float attn_scale;
  int32_t n_ctx_train; /* context_length; 0 when absent */
};

static tsr_status read_hparams(const struct tsr_host *h, const struct tsr_gguf *m,
                               struct g3_hparams *hp) {
  char key[96];
  memset(hp, 0, sizeof *hp);
#define KEY(suffix) (snprintf(key, sizeof key, "gemma3." suffix), key)
  tsr_status st = h->gguf->get_u32(m, KEY("embedding_length"), &hp->n_embd);
  if (st == TSR_OK) st = h->gguf->get_u32(m, KEY("attention.head_count"), &hp->n_head);
  if (st == TSR_OK) st = h->gguf->get_u32(m, KEY("block_count"), &hp->n_layer);
  if (st == TSR_OK) st = h->gguf->get_f32(m, KEY("attention.layer_norm_rms_epsilon"), &hp->eps);
  if (st == TSR_OK) st = h->gguf->get_f32(m, KEY("rope.freq_base"), &hp->rope_base);
  hp->rope_base_swa = 10000.0f; /* Gemma 3's local base, which llama.cpp implies */
  if (st == TSR_OK && h->gguf->has_key(m, KEY("rope.freq_base_swa")))
    st = h->gguf->get_f32(m, key, &hp->rope_base_swa);
  hp->rope_scale = 1.0f;
  if (st == TSR_OK && h->gguf->has_key(m, KEY("rope.scaling.type"))) {
    const char *type;
    st = h->gguf->get_str(m, key, &type);
    if (st == TSR_OK && strcmp(type, "linear") && strcmp(type, "none"))
      st = h->set_error(TSR_ERR_UNSUPPORTED, "arch_gemma4: gemma3.rope.scaling.type '%s' is not "
                        "supported (linear and none are)", type);
  }
  if (st == TSR_OK && h->gguf->has_key(m, KEY("rope.scaling.factor"))) {
    float factor;
    st = h->gguf->get_f32(m, key, &factor);
    if (st == TSR_OK && !(factor > 0.0f))
      st = h->set_error(TSR_ERR_FORMAT, "gemma3.rope.scaling.factor is %g", (double)factor);
    if (st == TSR_OK) hp->rope_scale = 1.0f / factor;
  }
  uint32_t head_dim = 0, n_ctx = 0;
  if (st == TSR_OK && h->gguf->has_key(m, KEY("context_length")))
    st = h->gguf->get_u32(m, key, &n_ctx);
  hp->n_ctx_train = n_ctx > INT32_MAX ? INT32_MAX : (int32_t)n_ctx;
  if (st == TSR_OK) st = h->gguf->get_u32(m, KEY("attention.key_length"), &head_dim);
#undef KEY
  if (st == TSR_OK && (hp->n_head == 0 || head_dim == 0))
    st = h->set_error(TSR_ERR_FORMAT, "gemma3: head_count %u, key_length %u", hp->n_head,
                      head_dim);
  if (st == TSR_OK) {
    const float qpas = hp->n_layer == 62 ? (float)(hp->n_embd / hp->n_head) : (float)head_dim;
    hp->attn_scale = 1.0f / sqrtf(qpas);
  }
  return st;
}

/* NeoX RoPE with the layer kind's base. Unscaled, it rounds as transformers
** does (rope_gemma4.c says why); a scaled full layer uses the core's rope.
** rope_op points at the rounding op's id (NULL: not registered). */
static struct tsr_attn_rope layer_rope(const struct tsr_arch_forward *fw,
                                       const struct g3_hparams *hp, const int32_t *rope_op,
                                       const struct tsr_arch_layer *L) {
  const bool swa = L->kind == TSR_LAYER_SLIDING;
  struct tsr_attn_rope r = {.struct_size = sizeof r, .n_rot = L->head_dim_k, .neox = 1,
                            .freq_base = swa ? hp->rope_base_swa : hp->rope_base,
                            .freq_scale = swa ? 1.0f : hp->rope_scale,
                            .n_ctx_train = hp->n_ctx_train, .model = fw->model,
                            .arch = "gemma3"};
  if (rope_op && *rope_op >= 0 && r.freq_scale == 1.0f) {
    r.rotate = gemma4_rope_rotate;
    r.rotate_ctx = (void *)(uintptr_t)rope_op;
  }
  return r;
}

static struct tsr_tensor *attention_block(const struct tsr_host *h, struct tsr_arch_forward *fw,
                                          const struct g3_hparams *hp, const int32_t *rope_op,
                                          int il, struct tsr_tensor *x) {
  struct tsr_graph *g = fw->g;
  const struct tsr_arch_layer *L = &fw->layers[il];
  const struct tsr_attn_rope rope = layer_rope(fw, hp, rope_op, L);
  const int64_t n = fw->n_tokens, hd = L->head_dim_k, nh = L->n_head, nkv = L->n_head_kv;
  struct tsr_tensor *q =
      h->graph->reshape(g, gemma_linear(h, fw, il, "attn_q.weight", x), 3, (int64_t[]){hd, nh, n});
  struct tsr_tensor *k =
      h->graph->reshape(g, gemma_linear(h, fw, il, "attn_k.weight", x), 3, (int64_t[]){hd, nkv, n});
  struct tsr_tensor *v = h->graph->reshape(g, gemma_linear(h, fw, il, "attn_v.weight", x), 3,
                                           (int64_t[]){L->head_dim_v, nkv, n});
  /* RoPE at each token's position, or as the attention places q and k itself */
  q = h->arch->attn_rope(fw, il, &rope, gemma_norm(h, fw, hp->eps, il, "attn_q_norm.weight", q),
                         false);
  k = h->arch->attn_rope(fw, il, &rope, gemma_norm(h, fw, hp->eps, il, "attn_k_norm.weight", k),
                         true);

  struct tsr_layer_desc desc = {
      .struct_size = sizeof desc, .layer = il, .kind = L->kind, .n_head = L->n_head,
      .n_head_kv = L->n_head_kv, .head_dim_k = L->head_dim_k, .head_dim_v = L->head_dim_v,
      .window = L->window, .k_codec = "f32", .v_codec = "f32", .backend = "cpu"};
  struct tsr_attn_call call = {
      .struct_size = sizeof call, .layer = &desc, .q = h->graph->permute(g, q, 0, 2, 1, 3),
      .k = h->graph->permute(g, k, 0, 2, 1, 3), .v = h->graph->permute(g, v, 0, 2, 1, 3),
      .q_pos = fw->positions, .kv_pos = fw->positions, .scale = hp->attn_scale, .causal = true,
      .window = L->kind == TSR_LAYER_SLIDING ? L->window : 0, .rope = &rope};
  if (!call.q || !call.k || !call.v) return NULL;
  /* with a cache: write this batch's k/v, attend over every cell of the sequence */
  if (fw->kv && h->arch->kv_attend(fw, il, call.k, call.v, &call) != TSR_OK) return NULL;
  struct tsr_tensor *o = h->arch->attn_build(fw, il, &call);
  if (!o) return NULL;
  o = h->graph->reshape(g, o, 2, (int64_t[]){L->head_dim_v * nh, n});
  return gemma_linear(h, fw, il, "attn_output.weight", o);
}

tsr_status gemma3_build(void *ctx, const struct tsr_host *h, struct tsr_arch_forward *fw) {
  const struct gemma4_ops *ops = ctx;
  const int32_t *rope_op = ops ? &ops->rope : NULL; /* the rounding rope, or the core's */
  struct g3_hparams hp;
  tsr_status st = read_hparams(h, fw->model, &hp);
  if (st != TSR_OK) return st;
  struct tsr_graph *g = fw->g;
  struct tsr_tensor *emb = h->graph->weight(g, fw->model, "token_embd.weight");
  struct tsr_tensor *x =
      h->graph->scale(g, h->graph->get_rows(g, emb, fw->tokens), sqrtf((float)hp.n_embd));
  fw->embed = x;
  for (int il = 0; il < fw->n_layers; il++) {
    struct tsr_tensor *a =
        attention_block(h, fw, &hp, rope_op, il, gemma_norm(h, fw, hp.eps, il, "attn_norm.weight", x));
    x = h->graph->add(g, x, gemma_norm(h, fw, hp.eps, il, "post_attention_norm.weight", a));
    struct tsr_tensor *m = gemma_mlp_block(h, fw, il, gemma_norm(h, fw, hp.eps, il, "ffn_norm.weight", x));
    x = h->graph->add(g, x, gemma_norm(h, fw, hp.eps, il, "post_ffw_norm.weight", m));
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
