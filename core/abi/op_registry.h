/*
** Ops that plugins register: a name gets a process-wide id; kernels are
** attached per backend name. Ids are never reused (plugins stay resident).
*/
#ifndef TSR_OP_REGISTRY_H
#define TSR_OP_REGISTRY_H

#include "graph/tensor.h"
#include "tessera/plugin.h"

#define TSR_MAX_CUSTOM_OPS 256

/* New id for name; registering a name twice is an error naming it. */
tsr_status tsr_op_registry_add(const char *name, int32_t *op_id);
tsr_status tsr_op_registry_add_kernel(int32_t op_id, const char *backend, tsr_plugin_kernel_fn fn,
                                      void *ctx);
/* A kernel for backend from a shared object: path (absolute, or as dlopen
** takes it) and the exported symbol, opened at the first lookup for that
** backend (tsr_op_registry_resolve), never before. */
tsr_status tsr_op_registry_add_kernel_lib(int32_t op_id, const char *backend, const char *path,
                                          const char *symbol, void *ctx);
/* The kernel of op_id for backend, opening its shared object on first use.
** No kernel, or a library that does not load or lacks the symbol, is
** TSR_ERR_UNSUPPORTED with a message naming the op (and file). */
tsr_status tsr_op_registry_resolve(int32_t op_id, const char *backend, tsr_plugin_kernel_fn *fn,
                                   void **ctx);
/* Marks op_id's kernel for backend replayable (plugin.h, declare_replayable); an
** op without such a kernel is an error naming it. */
tsr_status tsr_op_registry_set_replayable(int32_t op_id, const char *backend);
/* 1 when op_id's kernel for backend was declared replayable, else 0. */
int tsr_op_registry_replayable(int32_t op_id, const char *backend);
/* The id registered under name ("arch_gemma4.rope_f32"), or -1. */
int32_t tsr_op_registry_find(const char *name);
/* The device call a device backend is making on this thread (plugin.h,
** host->kernel->device_call); NULL when none. The backend sets it around each call. */
void tsr_op_registry_set_device_call(struct tsr_device_call *call);
struct tsr_device_call *tsr_op_registry_device_call(void);
/* NULL if no such id. */
const char *tsr_op_registry_name(int32_t op_id);
/* The kernel for a backend, or NULL (ctx untouched). */
tsr_plugin_kernel_fn tsr_op_registry_kernel(int32_t op_id, const char *backend, void **ctx);
/* Whether op_id has a kernel registered for backend, without opening its library. */
bool tsr_op_registry_has_kernel(int32_t op_id, const char *backend);

/* A plugin's view of a core tensor (layout and data pointer). */
void tsr_tensor_get_info(const struct tsr_tensor *t, struct tsr_tensor_info *out);

#endif
