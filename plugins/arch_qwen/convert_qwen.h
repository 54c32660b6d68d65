/* arch_qwen's converter (tessera convert): see convert_qwen.c. */
#ifndef ARCH_QWEN_CONVERT_H
#define ARCH_QWEN_CONVERT_H

#include "tessera/plugin.h"

/* config.json model_type values qwen_convert() accepts. */
#define QWEN_HF_TYPES "qwen2,qwen3,qwen3_moe,qwen3_5,qwen3_5_text,qwen3_5_moe,qwen3_5_moe_text"

/* The arch interface's convert(): a Hugging Face Qwen checkpoint to GGUF as
** llama.cpp's converter writes it. */
tsr_status qwen_convert(void *ctx, const struct tsr_host *host, struct tsr_convert *cv);

#endif
