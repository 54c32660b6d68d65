/*
** The calling convention of a plugin's CUDA kernels (register_kernel_lib with
** backend "cuda"; plugin.h), as inline helpers for the plugin's .cu files:
** a kernel gets the host services table as ctx, reads the device and stream
** of the node it runs from host->kernel->device_call(), queues its work on that
** stream without waiting, and reports a failed launch in call->status.
**
**   struct tsr_device_call *call = tsr_cuda_call_begin(ctx);
**   my_kernel<<<grid, block, 0, tsr_cuda_call_stream(call)>>>(...);
**   tsr_cuda_call_finish(ctx, call, "arch_x my_op");
*/
#ifndef TESSERA_PLUGIN_CUDA_H
#define TESSERA_PLUGIN_CUDA_H

#include <cuda_runtime.h>

#include "tessera/plugin.h"

static inline struct tsr_device_call *tsr_cuda_call_begin(void *ctx) {
  const struct tsr_host *host = (const struct tsr_host *)ctx;
  struct tsr_device_call *call = host->kernel->device_call();
  if (call) cudaSetDevice(call->device);
  return call;
}

static inline cudaStream_t tsr_cuda_call_stream(const struct tsr_device_call *call) {
  return (cudaStream_t)(call ? call->stream : NULL);
}

/* Records a launch error of the kernels queued since begin, naming `what`. */
static inline void tsr_cuda_call_finish(void *ctx, struct tsr_device_call *call,
                                        const char *what) {
  const struct tsr_host *host = (const struct tsr_host *)ctx;
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess && call)
    call->status = host->set_error(TSR_ERR_INTERNAL, "%s: kernel launch failed: %s (%s)", what,
                                   cudaGetErrorName(e), cudaGetErrorString(e));
}

/* The device's multiprocessors (what a kernel sizes its grid or key splits by), asked once a
** device; 132 (an H100's) where the driver does not say. */
static inline int tsr_cuda_sm_count(int device) {
  static int cached = -1, cached_device = -1;
  if (cached < 0 || cached_device != device) {
    if (cudaDeviceGetAttribute(&cached, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
      cached = 132;
    cached_device = device;
  }
  return cached;
}

#endif
