/*
** The one door between the core and libtessera-cuda.so. The core dlopens the
** shared object, looks up TSR_CUDA_ENTRY and calls it with a host table; the
** shared object returns a filled struct tsr_backend (core/graph/backend.h).
**
** The shared object is built from this same tree and reads core structs
** (tensors, planned graphs) directly, so the table carries their sizes and a
** version: a .so from another build is refused instead of misreading memory.
** Errors raised inside the .so land in the core's per-thread message through
** set_error, so tsr_error_message() reads the same as for any core failure.
*/
#ifndef TSR_CUDA_ABI_H
#define TSR_CUDA_ABI_H

#include <stdint.h>

#include "graph/cuda_settings.h"
#include "tessera/plugin.h"
#include "tessera/tessera.h"

struct tsr_dtype_traits;

/* 2: keep / sync_to_device in struct tsr_backend_i; 3: plugin kernels (custom_op_kernel,
** set_device_call); 4: probe in struct tsr_backend_i; 5: time_nodes in struct
** tsr_backend_i, times in struct tsr_backend; 6: memory in struct tsr_backend_i,
** backend_size checked; 7: custom_op_replayable; 8: graph_counts in struct tsr_backend_i;
** 9: gemm_how of struct tsr_backend_ceilings 384 bytes; 10: dtype_traits, codec_ops;
** 11: the open function takes the settings (core/graph/cuda_settings.h); 12: codec_ops
** returns the read op */
#define TSR_CUDA_ABI_VERSION 13
#define TSR_CUDA_ENTRY "tsr_cuda_backend_open"

struct tsr_backend;

struct tsr_cuda_host {
  uint32_t abi_version; /* TSR_CUDA_ABI_VERSION */
  uint32_t struct_size; /* sizeof(struct tsr_cuda_host) */
  uint32_t tensor_size; /* sizeof(struct tsr_tensor) */
  uint32_t graph_size;  /* sizeof(struct tsr_graph) (core/graph/graph_internal.h) */
  uint32_t backend_size; /* sizeof(struct tsr_backend) (core/graph/backend.h): the .so fills one */
  void (*set_error)(const char *message);
  const char *(*get_error)(void);
  /* name of a plugin-registered op, or NULL (core/abi/op_registry.h) */
  const char *(*custom_op_name)(int32_t op_id);
  /* a plugin op's kernel for `backend` (its library opened on first use), or
  ** an error naming the op and what is missing (op_registry.h) */
  tsr_status (*custom_op_kernel)(int32_t op_id, const char *backend, tsr_plugin_kernel_fn *fn,
                                 void **ctx);
  /* what host->device_call() hands a plugin kernel on this thread; NULL after */
  void (*set_device_call)(struct tsr_device_call *call);
  /* 1 when a plugin op's kernel for `backend` was declared replayable (plugin.h) */
  int (*custom_op_replayable)(int32_t op_id, const char *backend);
  /* the core's dtype traits, for the codec dtypes its plugins registered (dtype.h) */
  const struct tsr_dtype_traits *(*dtype_traits)(int type_id);
  /* 1 and the plugin ops of a codec dtype's device kernels (dtype.h), else 0 */
  int (*codec_ops)(int type_id, int32_t *encode_op, int32_t *lift_op, int32_t *read_op);
};

/* settings: the profile's, with the environment's overrides applied (the .so reads no
** variable itself) */
typedef tsr_status (*tsr_cuda_open_fn)(const struct tsr_cuda_host *host,
                                       const struct tsr_cuda_settings *settings,
                                       struct tsr_backend **out);

#endif
