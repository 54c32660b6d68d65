/*
** rotation.h's rotation on the cuda backend, which kv_tcq's kernels share: one block
** of G threads (64 or 128) a group of a row, the Walsh-Hadamard butterflies in shared
** memory.
*/
#ifndef KV_TURBO_ROTATION_CUH
#define KV_TURBO_ROTATION_CUH

#include <cuda_runtime.h>

#include "tessera/plugin_cuda.h"

#include "../rotation.h"

__global__ void turbo_k_rotate(const float *src, int64_t in_dim, float *dst, int64_t out_dim,
                               int64_t groups, int G, int inverse) {
  __shared__ float v[TURBO_GROUP_MAX];
  const int64_t row = blockIdx.x / groups, g0 = (blockIdx.x % groups) * G;
  const int t = threadIdx.x;
  const float x = g0 + t < in_dim ? src[row * in_dim + g0 + t] : 0.0f;
  v[t] = x * turbo_sign((uint32_t)t, inverse ? 2 : 1);
  __syncthreads();
  for (int len = 1; len < G; len <<= 1) {
    const bool low = (t & len) == 0;
    const float a = v[low ? t : t - len], b = v[low ? t + len : t];
    __syncthreads();
    v[t] = low ? a + b : a - b;
    __syncthreads();
  }
  if (g0 + t < out_dim)
    dst[row * out_dim + g0 + t] =
        v[t] * rsqrtf((float)G) * turbo_sign((uint32_t)t, inverse ? 1 : 2);
}

/* rows contiguous rows of in_dim values -> out_dim values each (turbo_rotate_row's
** semantics) */
static inline void turbo_rotate_launch(const float *src, int64_t in_dim, float *dst,
                                       int64_t out_dim, int64_t rows, bool inverse,
                                       cudaStream_t stream) {
  const int64_t rotated = inverse ? in_dim : out_dim; /* whole blocks */
  const int G = turbo_group(rotated);
  const int64_t groups = rotated / G;
  turbo_k_rotate<<<(unsigned)(rows * groups), G, 0, stream>>>(src, in_dim, dst, out_dim, groups,
                                                               G, inverse);
}

/* The rotation op's cuda entry, for a plugin whose state starts with its host and its
** self: the launch, and the counters once a call (on a capture the replays count). */
static inline void turbo_rotate_entry(const struct tsr_host *host, struct tsr_plugin *self,
                                      const struct tsr_tensor_info *dst,
                                      const struct tsr_tensor_info *src, const int32_t *params,
                                      const char *what) {
  struct tsr_device_call *call = tsr_cuda_call_begin((void *)host);
  const int inverse = params[TURBO_P_INVERSE] != 0;
  const int64_t rows = dst->ne[1] * dst->ne[2] * dst->ne[3];
  const int64_t graph = tsr_device_call_graph(call);
  if (graph != TSR_DEVICE_CALL_REPLAY && rows > 0) {
    turbo_rotate_launch((const float *)src[0].data, src[0].ne[0], (float *)dst->data,
                        dst->ne[0], rows, inverse, tsr_cuda_call_stream(call));
    tsr_cuda_call_finish((void *)host, call, what);
  }
  if (graph != TSR_DEVICE_CALL_CAPTURE && rows > 0)
    host->engaged(self, inverse ? "outputs_unrotated" : "rows_rotated", (uint64_t)rows);
}

#endif
