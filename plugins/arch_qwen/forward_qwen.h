/* arch_qwen's forward passes: forward_qwen3.c (qwen2, qwen3, qwen3moe) and
** forward_qwen35.c (the qwen35 / qwen35moe hybrids), and the block builders
** they share. */
#ifndef TSR_FORWARD_QWEN_H
#define TSR_FORWARD_QWEN_H

#include "tessera/plugin.h"

/* ctx: the struct tsr_qwen_ops that init filled (ops_deltanet.h) */
tsr_status tsr_qwen_build(void *ctx, const struct tsr_host *host, struct tsr_arch_forward *fw);
tsr_status tsr_qwen35_build(void *ctx, const struct tsr_host *host, struct tsr_arch_forward *fw);
/* The NextN / MTP head of a qwen35 / qwen35moe model (tsr_arch_v1.build_nextn). */
tsr_status tsr_qwen35_build_nextn(void *ctx, const struct tsr_host *host,
                                  struct tsr_arch_forward *fw);
/* context shift: re-rotates the moved cells' keys of every layer (qwen2, qwen3, qwen3moe;
** the hybrids' recurrent state cannot shift and is refused) */
tsr_status tsr_qwen_shift_keys(void *ctx, const struct tsr_host *host, struct tsr_kv_shift *sh);

/* arch_qwen's validate() (validate_qwen.c): the file's keys against its tensors */
tsr_status tsr_qwen_validate(void *ctx, const struct tsr_host *host, const struct tsr_gguf *m,
                             const struct tsr_arch_layer *layers, int32_t n_layers);

/* the trained context of arch's keys, and the file m and key prefix arch, into rope */
tsr_status tsr_qwen_rope_hints(const struct tsr_host *h, const struct tsr_gguf *m,
                               const char *arch, struct tsr_attn_rope *rope);

/* weight of layer il, e.g. blk.3.attn_q.weight; the optional one is NULL when absent */
struct tsr_tensor *tsr_qwen_layer_weight(const struct tsr_host *h, struct tsr_arch_forward *fw,
                                         int il, const char *name);
struct tsr_tensor *tsr_qwen_optional_layer_weight(const struct tsr_host *h,
                                                  struct tsr_arch_forward *fw, int il,
                                                  const char *name);
/* x·W (+ b when the file has blk.il.NAME.bias) */
struct tsr_tensor *tsr_qwen_linear(const struct tsr_host *h, struct tsr_arch_forward *fw, int il,
                                   const char *name, struct tsr_tensor *x);
/* down(silu(gate·x) ⊙ up·x) from blk.il.ffn_{gate,up,down}SUFFIX */
struct tsr_tensor *tsr_qwen_mlp_block(const struct tsr_host *h, struct tsr_arch_forward *fw, int il,
                                      const char *suffix, struct tsr_tensor *x);

struct tsr_qwen_moe {
  int64_t n_embd, n_expert, n_expert_used;
  bool expert_norm; /* renormalise the top-k router weights */
};
/* the routed experts of layer il (no shared expert) */
struct tsr_tensor *tsr_qwen_moe_block(const struct tsr_host *h, struct tsr_arch_forward *fw,
                                      const struct tsr_qwen_moe *moe, int il, struct tsr_tensor *x);

#endif
