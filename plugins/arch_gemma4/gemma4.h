/*
** arch_gemma4 internals shared by the plugin's files and its tests.
**
** gemma4_plan() is the layer plan as a pure function of the hyperparameters,
** so the tests can check it on any GGUF (their own and converted fixtures)
** whatever the host can read; arch_gemma4.c fills the hyperparameters from
** the GGUF through host calls and hands them here.
*/
#ifndef TSR_ARCH_GEMMA4_H
#define TSR_ARCH_GEMMA4_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tessera/plugin.h"

/* llama.cpp's LLAMA_MAX_LAYERS; gemma4 31B has 60. */
#define GEMMA4_MAX_LAYERS 512

/* What the plan needs, as the GGUF states it (keys under "<arch>."). */
struct gemma4_hparams {
  int32_t n_layer;                     /* block_count */
  int32_t n_head;                      /* attention.head_count */
  int32_t n_head_kv[GEMMA4_MAX_LAYERS]; /* attention.head_count_kv, per layer */
  int32_t head_dim_k, head_dim_v;      /* attention.key_length / value_length: full layers */
  int32_t head_dim_k_swa, head_dim_v_swa; /* ..._swa: sliding layers */
  int32_t window;                      /* attention.sliding_window */
  int32_t n_kv_shared;                 /* attention.shared_kv_layers */
  bool swa[GEMMA4_MAX_LAYERS];         /* attention.sliding_window_pattern: true = sliding */
};

/*
** Fills layers[0..n_layer) and, when kv_source is not NULL, kv_source[l]:
** -1 for a layer that owns its K/V cache, else the layer whose K/V it reads.
**
** KV sharing (E2B/E4B, the assistant drafter): the last n_kv_shared layers
** compute no K/V. Each reads the K/V of the last layer below the shared
** block that has its own kind (sliding or full): its kv_shared_from is that
** layer + 1 and its head count and dims are those of the K/V it reads (it
** owns no cache; the memory plan counts none). When no such layer exists in
** this model (the assistant: every layer is shared) the source is the paired
** target's: kv_source -2, kv_shared_from -1.
**
** `arch` names the model in messages. Errors go through host->set_error.
*/
tsr_status gemma4_plan(const struct tsr_host *host, const char *arch,
                       const struct gemma4_hparams *hp, struct tsr_arch_layer *layers,
                       int32_t n_layers_max, int32_t *kv_source);

/* Gemma 3's implied pattern (llama.cpp: swa pattern 6; transformers: layer_types
** default): 5 sliding layers, then a full one. */
#define GEMMA3_SWA_PERIOD 6
static inline bool gemma3_layer_slides(int32_t l) {
  return l % GEMMA3_SWA_PERIOD != GEMMA3_SWA_PERIOD - 1;
}

#define GEMMA4_KV_OWN (-1)
#define GEMMA4_KV_TARGET (-2)

/* tessera convert for model_type gemma4, gemma4_text and gemma4_assistant
** (convert_gemma4.c). */
tsr_status gemma4_convert(void *ctx, const struct tsr_host *host, struct tsr_convert *cv);

/* The arch's validate() (validate_gemma4.c): the file's keys against its
** tensors, with describe()'s layer plan. */
tsr_status gemma4_validate(void *ctx, const struct tsr_host *host, const struct tsr_gguf *m,
                           const struct tsr_arch_layer *layers, int32_t n_layers);

/* The ids of the plugin's ops, -1 until init registers them. */
struct gemma4_ops {
  int32_t rope;           /* rope_f32 (rope_gemma4.c); its address is a rope_op below */
  int32_t ordered_logits; /* ordered_logits (ordered_logits_gemma4.c) */
};

/* The forward pass of `gemma4` and `gemma4-assistant` models (forward_gemma4.c):
** the arch's build(). ctx points at struct gemma4_ops (NULL: the core's rope,
** no assistant head). */
tsr_status gemma4_build(void *ctx, const struct tsr_host *host, struct tsr_arch_forward *fw);

/* The forward pass of `gemma3` models (forward_gemma3.c); ctx as gemma4_build's. */
tsr_status gemma3_build(void *ctx, const struct tsr_host *host, struct tsr_arch_forward *fw);

/* The assistant's ordered-embedding head (ordered_logits_gemma4.c): registers
** the op once per process, and appends it: full f32 [V, N], centroid_logits
** f32 [C, N], ordering i32 [V]; NULL with the graph's error set. */
tsr_status gemma4_ordered_register(const struct tsr_host *host, struct tsr_plugin *self,
                                   int32_t *op_id);
struct tsr_tensor *gemma4_ordered_logits(const struct tsr_host *host, struct tsr_graph *g,
                                         int32_t op_id, struct tsr_tensor *full,
                                         struct tsr_tensor *centroid_logits,
                                         struct tsr_tensor *ordering, int32_t top_k_clusters);

/* The cuda kernel of op id: symbol in arch_gemma4_cuda.so (cuda/), which the
** host opens only when a cuda run checks a graph holding the op. Each is a
** launch made from its node alone, so it is declared replayable: a decode graph
** holding it is captured as a CUDA graph. */
static inline tsr_status gemma4_register_cuda(const struct tsr_host *host, struct tsr_plugin *self,
                                              int32_t id, const char *symbol) {
  tsr_status st = host->kernel->register_kernel_lib(self, id, "cuda", "arch_gemma4_cuda.so", symbol,
                                                    (void *)host);
  return st == TSR_OK ? host->kernel->declare_replayable(self, id, "cuda") : st;
}

/* RoPE rounded as transformers rounds it (rope_gemma4.c): registers the op
** and its CPU kernel once (*op_id stays as it is when already >= 0), and
** appends it: x f32 [D, H, N], pos i32 [N], ff f32 [D/2] or NULL. */
tsr_status gemma4_rope_register(const struct tsr_host *host, struct tsr_plugin *self,
                                int32_t *op_id);
struct tsr_tensor *gemma4_rope(const struct tsr_host *host, struct tsr_graph *g, int32_t op_id,
                               struct tsr_tensor *x, struct tsr_tensor *pos,
                               struct tsr_tensor *ff, float base);
/* struct tsr_attn_rope's rotate with the rounding above: rotate_ctx points at
** the op id, freq_factors and freq_base come from the description */
struct tsr_tensor *gemma4_rope_rotate(const struct tsr_attn_rope *rope, const struct tsr_host *host,
                                      struct tsr_graph *g, struct tsr_tensor *x,
                                      struct tsr_tensor *pos);

/* Building blocks shared by the Gemma 3 and Gemma 4 forward passes
** (forward_gemma4.c): layer il's weight by suffix ("attn_q.weight"), its
** RMSNorm, its projection, and the GeGLU MLP down(gelu_tanh(gate.x) * up.x). */
struct tsr_tensor *gemma_layer_weight(const struct tsr_host *h, struct tsr_arch_forward *fw,
                                      int il, const char *name);
struct tsr_tensor *gemma_norm(const struct tsr_host *h, struct tsr_arch_forward *fw, float eps,
                              int il, const char *name, struct tsr_tensor *x);
struct tsr_tensor *gemma_linear(const struct tsr_host *h, struct tsr_arch_forward *fw, int il,
                                const char *name, struct tsr_tensor *x);
struct tsr_tensor *gemma_mlp_block(const struct tsr_host *h, struct tsr_arch_forward *fw, int il,
                                   struct tsr_tensor *x);

#endif
