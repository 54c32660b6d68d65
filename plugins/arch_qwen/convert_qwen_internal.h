/* Shared by convert_qwen.c (config and keys) and convert_qwen_tensors.c. */
#ifndef ARCH_QWEN_CONVERT_INTERNAL_H
#define ARCH_QWEN_CONVERT_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "convert_qwen.h"

#define NAME_LEN 256

enum qwen_family { QWEN2, QWEN3, QWEN3MOE, QWEN35, QWEN35MOE };

/* One conversion: the host, the checkpoint and what config.json says. */
struct qc {
  const struct tsr_host *h;
  struct tsr_convert *cv;
  enum qwen_family family;
  const char *arch;
  bool hybrid;      /* qwen35 family: Gated DeltaNet, gated attention, zero-centred norms */
  bool text_config; /* config.json nests the text model under text_config */
  const char *tp;   /* the text model's tensors: "model." or "model.language_model." */
  const char *mtp;  /* the MTP block's tensors: "mtp." or "model.mtp." */
  int64_t n_layer, n_mtp, n_embd, n_vocab, n_head, n_head_kv, head_dim, n_ff;
  int64_t n_expert;
  int64_t n_ff_exp, n_ff_shexp; /* moe_intermediate_size, shared_expert_...; -1: not given */
  bool attn_bias; /* config attention_bias (qwen3 and later) */
  int64_t hk, hv, dk, dv, conv_k; /* Gated DeltaNet: key heads, value heads, dims */
  bool *linear;                   /* per block (trunk, then MTP): Gated DeltaNet */
};

/* snprintf into a NAME_LEN buffer; returns out. */
const char *qfmt(char *out, const char *f, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Every tensor, named and laid out as llama.cpp's converter writes them. */
tsr_status qwen_write_tensors(struct qc *q);

#endif
