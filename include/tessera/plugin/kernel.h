/*
** tessera plugin ABI: plugin-defined ops' kernels and how a device backend
** calls them.
*/
#ifndef TESSERA_PLUGIN_KERNEL_H
#define TESSERA_PLUGIN_KERNEL_H

#include "tessera/plugin/abi.h"
#include "tessera/plugin/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a kernel registered for a device backend ("cuda") gets from
** host->device_call() while the backend calls it (appended in ABI 1.0's
** growth; check host->struct_size before reading device_call). */
struct tsr_device_call {
  uint32_t struct_size;
  const char *backend; /* "cuda" */
  int32_t device;      /* the device ordinal: cudaSetDevice(device) before launching */
  void *stream;        /* the cudaStream_t to enqueue on; the kernel never synchronizes it */
  int32_t status;      /* the kernel sets a tsr_status here (and host->set_error) when a
                       ** launch fails; the backend then fails the node with that message */
  /* Appended later (check struct_size): how a CUDA graph holds this call, which only a
  ** kernel declared replayable (host->declare_replayable) sees as other than EAGER:
  **   TSR_DEVICE_CALL_CAPTURE  the launches are being captured: enqueue them as usual
  **                            but do no host-side bookkeeping (host->engaged counts);
  **   TSR_DEVICE_CALL_REPLAY   the captured launches are being replayed: enqueue
  **                            nothing, do only the bookkeeping of a call.
  ** The backend makes one bookkeeping call per node and compute (a replay after a
  ** successful capture too; a capture that fails runs its nodes eagerly), so counters
  ** read the same with graphs on or off. Eight bytes: a 4-byte field would lie in the
  ** padding after status, which the struct_size of a backend built before it counts. */
  int64_t graph;
  /* Appended later (check struct_size; tsr_device_call_attn reads them): the backend's
  ** choices for the attention kernels a plugin may launch itself
  ** (tessera/cuda_attn_tile.cuh), as the backend's own attention takes them: the
  ** profile's backend.attention.pipeline (0, 1), .decode (0 tile, 1 gqa, 2 gqa_staged;
  ** TSR_ATTN_GQA_DECODE_DEFAULT), .split_keys (0: default). */
  int32_t attn_pipelined, attn_gqa_decode, attn_split_keys, attn_reserved;
};

/* Decode attention's default kernel: the GQA decode kernel, staged where its rows allow
** (backend.attention.decode gqa_staged; tessera/cuda_attn_gqa.cuh). */
enum { TSR_ATTN_GQA_DECODE_DEFAULT = 2 };

enum { TSR_DEVICE_CALL_EAGER = 0, TSR_DEVICE_CALL_CAPTURE = 1, TSR_DEVICE_CALL_REPLAY = 2 };

/* How a CUDA graph holds a device call (struct tsr_device_call.graph); EAGER for a
** call from a backend built before the field. */
static inline int64_t tsr_device_call_graph(const struct tsr_device_call *call) {
  if (!call || call->struct_size < offsetof(struct tsr_device_call, graph) + sizeof call->graph)
    return TSR_DEVICE_CALL_EAGER;
  return call->graph;
}

/* The backend's attention choices of a call (struct tsr_device_call.attn_*); the defaults
** for a call from a backend built before the fields. */
static inline void tsr_device_call_attn(const struct tsr_device_call *call, int32_t *pipelined,
                                        int32_t *gqa_decode, int32_t *split_keys) {
  *pipelined = *split_keys = 0;
  *gqa_decode = TSR_ATTN_GQA_DECODE_DEFAULT;
  if (!call || call->struct_size < offsetof(struct tsr_device_call, attn_reserved) +
                                       sizeof call->attn_reserved)
    return;
  *pipelined = call->attn_pipelined, *gqa_decode = call->attn_gqa_decode;
  *split_keys = call->attn_split_keys;
}

/* A kernel of a plugin-defined op for one backend. */
typedef void (*tsr_plugin_kernel_fn)(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                                     const struct tsr_tensor_info *src, int n_src,
                                     const int32_t *params);

#ifdef __cplusplus
}
#endif

#endif /* TESSERA_PLUGIN_KERNEL_H */
