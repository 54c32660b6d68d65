/*
** tessera plugin ABI: element types and tensor layouts as a plugin's kernel
** or builder sees them.
**
** A dtype id is a GGUF type id (what a model file stores: the plain floats and
** integers, and the block-quantized types), tessera's own KV type q6_0, or an
** id the host assigns to a KV codec of its own block layout when the codec is
** registered (kv_codec.h, TSR_KV_CODEC_OWN_DTYPE): those lie in
** [TSR_DTYPE_ID_CODEC_FIRST, TSR_DTYPE_ID_CODEC_FIRST + TSR_DTYPE_ID_CODEC_COUNT),
** never appear in a file, and host->find_kv_codec(self, NULL, dtype) names
** the codec behind one. Ids of the same (plugin, codec) pair agree across the
** hosts of a process.
*/
#ifndef TESSERA_PLUGIN_DTYPE_H
#define TESSERA_PLUGIN_DTYPE_H

#include "tessera/plugin/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The ids a plugin names in new_tensor, cast, custom_op_typed and a codec's
** dtype; every other GGUF id may still arrive in a weight's tensor info. */
enum tsr_dtype_id {
  TSR_DTYPE_ID_F32 = 0,
  TSR_DTYPE_ID_F16 = 1,
  TSR_DTYPE_ID_Q4_0 = 2,
  TSR_DTYPE_ID_Q4_1 = 3,
  TSR_DTYPE_ID_Q5_0 = 6,
  TSR_DTYPE_ID_Q5_1 = 7,
  TSR_DTYPE_ID_Q8_0 = 8,
  TSR_DTYPE_ID_I32 = 26,
  TSR_DTYPE_ID_BF16 = 30,
  TSR_DTYPE_ID_Q6_0 = 1000, /* tessera's: 32 values, f16 d, 6-bit q, x = d * (q - 32) */
  TSR_DTYPE_ID_CODEC_FIRST = 1100,
  TSR_DTYPE_ID_CODEC_COUNT = 32,
};

/* Element type and layout of a tensor, as a plugin's kernel or builder sees
** it (host->graph->tensor_info, a kernel's dst and src). */
struct tsr_tensor_info {
  uint32_t struct_size;
  int32_t dtype; /* a dtype id */
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
