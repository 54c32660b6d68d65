/*
** tessera plugin ABI: element types and tensor layouts as a plugin's kernel
** or builder sees them.
*/
#ifndef TESSERA_PLUGIN_DTYPE_H
#define TESSERA_PLUGIN_DTYPE_H

#include "tessera/plugin/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element type and layout of a tensor, as a plugin's kernel or builder sees
** it. dtype ids are GGUF type ids, or ids the host assigned to registered
** codecs. */
struct tsr_tensor_info {
  uint32_t struct_size;
  int32_t dtype;
  int32_t n_dims;
  int64_t ne[4];
  size_t nb[4];
  void *data; /* NULL until the graph is planned and bound */
  const char *name;
};

#ifdef __cplusplus
}
#endif

#endif /* TESSERA_PLUGIN_DTYPE_H */
