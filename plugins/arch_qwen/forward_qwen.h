/* arch_qwen's forward passes (forward_qwen3.c). */
#ifndef TSR_FORWARD_QWEN_H
#define TSR_FORWARD_QWEN_H

#include "tessera/plugin.h"

tsr_status tsr_qwen_build(void *ctx, const struct tsr_host *host, struct tsr_arch_forward *fw);

#endif
