/*
** Ops that plugins register: a name gets a process-wide id; kernels are
** attached per backend name. Ids are never reused (plugins stay resident).
*/
#ifndef TSR_OP_REGISTRY_H
#define TSR_OP_REGISTRY_H

#include "tensor.h"
#include "tessera/plugin.h"

#define TSR_MAX_CUSTOM_OPS 256

/* New id for name; registering a name twice is an error naming it. */
tsr_status tsr_op_registry_add(const char *name, int32_t *op_id);
tsr_status tsr_op_registry_add_kernel(int32_t op_id, const char *backend, tsr_plugin_kernel_fn fn,
                                      void *ctx);
/* NULL if no such id. */
const char *tsr_op_registry_name(int32_t op_id);
/* The kernel for a backend, or NULL (ctx untouched). */
tsr_plugin_kernel_fn tsr_op_registry_kernel(int32_t op_id, const char *backend, void **ctx);

/* A plugin's view of a core tensor (layout and data pointer). */
void tsr_tensor_get_info(const struct tsr_tensor *t, struct tsr_tensor_info *out);

#endif
