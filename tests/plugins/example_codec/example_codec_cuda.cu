/*
** example_codec's rotation on the cuda backend (example_codec_cuda.so, opened
** by the host only on a cuda run). One block of 128 threads a group of a row:
** each thread holds one value through the seven butterfly stages of the
** Walsh-Hadamard transform in shared memory. Semantics are example_codec.c's.
*/
#include <cuda_runtime.h>
#include <stdint.h>

#include <tessera/plugin_cuda.h>

#include "example_codec.h"

__global__ void k_rotate(const float *src, int64_t in_dim, float *dst, int64_t out_dim,
                         int64_t groups, int inverse) {
  __shared__ float v[ROT_GROUP];
  const int64_t row = blockIdx.x / groups, g0 = (blockIdx.x % groups) * ROT_GROUP;
  const int t = threadIdx.x;
  const float x = g0 + t < in_dim ? src[row * in_dim + g0 + t] : 0.0f;
  v[t] = x * rot_sign((uint32_t)t, inverse ? 2 : 1);
  __syncthreads();
  for (int len = 1; len < ROT_GROUP; len <<= 1) {
    const bool low = (t & len) == 0;
    const float a = v[low ? t : t - len], b = v[low ? t + len : t];
    __syncthreads();
    v[t] = low ? a + b : a - b;
    __syncthreads();
  }
  if (g0 + t < out_dim)
    dst[row * out_dim + g0 + t] = v[t] * ROT_INV_SQRT_GROUP * rot_sign((uint32_t)t, inverse ? 1 : 2);
}

extern "C" TSR_PLUGIN_EXPORT void
example_codec_rotate_cuda(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                          const struct tsr_tensor_info *src, int n_src, const int32_t *params) {
  (void)ith, (void)nth, (void)n_src;
  (void)ctx;
  const struct codec_state *st = rot_state(params);
  struct tsr_device_call *call = tsr_cuda_call_begin((void *)st->host);
  const int inverse = params[ROT_P_INVERSE] != 0;
  const int64_t rows = dst->ne[1] * dst->ne[2] * dst->ne[3];
  const int64_t graph = tsr_device_call_graph(call);
  if (graph != TSR_DEVICE_CALL_REPLAY && rows > 0) {
    const int64_t rotated = inverse ? src[0].ne[0] : dst->ne[0]; /* whole groups */
    const int64_t groups = rotated / ROT_GROUP;
    k_rotate<<<(unsigned)(rows * groups), ROT_GROUP, 0, tsr_cuda_call_stream(call)>>>(
        (const float *)src[0].data, src[0].ne[0], (float *)dst->data, dst->ne[0], groups, inverse);
    tsr_cuda_call_finish((void *)st->host, call, "example_codec rotate");
  }
  /* counted once a call: on a capture the replays count */
  if (graph != TSR_DEVICE_CALL_CAPTURE && rows > 0)
    st->host->engaged(st->self, inverse ? "rows_unrotated" : "rows_rotated", (uint64_t)rows);
}
