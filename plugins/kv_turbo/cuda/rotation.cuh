/*
** rotation.h's rotation on the cuda backend, which kv_tcq's kernels share: one block
** of G threads (64 or 128) a group of a row, the Walsh-Hadamard butterflies in shared
** memory.
*/
#ifndef KV_TURBO_ROTATION_CUH
#define KV_TURBO_ROTATION_CUH

#include <cuda_runtime.h>

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

#endif
