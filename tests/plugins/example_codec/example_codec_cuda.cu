/*
** example_codec's kernels on the cuda backend (example_codec_cuda.so, opened
** by the host only on a cuda run); semantics are example_codec.c's.
**   rotate: one block of 128 threads a group of a row, each thread holding one
**           value through the seven butterfly stages of the Walsh-Hadamard
**           transform in shared memory;
**   q8_f32 encode / lift: one warp a block of 32 values (a lane a value), the
**           scale from a warp max;
**   q8_f32 read: attention over a q8_f32 K and V decoded in register, one warp
**           a (head, query).
*/
#include <cuda_fp16.h>
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

/* ---- q8_f32 ------------------------------------------------------------- */

/* rows [S, n, H] f32 (strided: rb0, rb1, rb2 bytes) -> the cache's cells (a cell per
** row, or per row and head when cells is [n, H]; cb0, cb1 bytes) */
__global__ void k_q8f_encode(const char *rows, size_t rb0, size_t rb1, size_t rb2,
                             const char *cells,
                             size_t cb0, size_t cb1, bool cell_per_head, uint8_t *cache,
                             size_t nb1, size_t nb2, int64_t S, int64_t n, int64_t H) {
  const int64_t block = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t per_row = S / Q8F_BLOCK, total = per_row * n * H;
  if (block >= total) return;
  const int64_t b = block % per_row, i = block / per_row % n, h = block / per_row / n;
  const float x = *(const float *)(rows + (b * Q8F_BLOCK + lane) * rb0 + i * rb1 + h * rb2);
  float amax = fabsf(x);
  for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
  const int32_t cell = *(const int32_t *)(cells + i * cb0 + (cell_per_head ? h * cb1 : 0));
  uint8_t *o = cache + (size_t)cell * nb1 + (size_t)h * nb2 + (size_t)b * Q8F_BYTES;
  if (lane == 0) memcpy(o, &d, 4);
  o[4 + lane] = (uint8_t)(int8_t)__float2int_rn(x * id);
}

/* a view of the cache [S, n, H] (strided) -> f16 [S, n, H] contiguous */
__global__ void k_q8f_lift(const uint8_t *src, size_t nb1, size_t nb2, __half *dst, int64_t S,
                           int64_t n, int64_t H) {
  const int64_t block = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t per_row = S / Q8F_BLOCK, total = per_row * n * H;
  if (block >= total) return;
  const int64_t b = block % per_row, i = block / per_row % n, h = block / per_row / n;
  const uint8_t *o = src + (size_t)i * nb1 + (size_t)h * nb2 + (size_t)b * Q8F_BYTES;
  float d;
  memcpy(&d, o, 4);
  dst[(h * n + i) * S + b * Q8F_BLOCK + lane] = __float2half_rn(d * (float)(int8_t)o[4 + lane]);
}

/* ctx: the host's services table (example_codec.c registers it with the kernels) */
static void launch_q8f(void *ctx, const struct tsr_tensor_info *dst,
                       const struct tsr_tensor_info *src, bool encode, const char *what) {
  const struct tsr_host *host = (const struct tsr_host *)ctx;
  struct tsr_device_call *call = tsr_cuda_call_begin((void *)host);
  const struct tsr_tensor_info *rows = encode ? &src[0] : dst;
  const int64_t S = rows->ne[0], n = rows->ne[1], H = rows->ne[2];
  const int64_t blocks = S / Q8F_BLOCK * n * H;
  if (blocks <= 0) return;
  const unsigned grid = (unsigned)((blocks + 7) / 8);
  if (encode)
    k_q8f_encode<<<grid, 256, 0, tsr_cuda_call_stream(call)>>>(
        (const char *)src[0].data, src[0].nb[0], src[0].nb[1], src[0].nb[2],
        (const char *)src[1].data,
        src[1].nb[0], src[1].nb[1], src[1].ne[1] > 1, (uint8_t *)dst->data, dst->nb[1],
        dst->nb[2], S, n, H);
  else
    k_q8f_lift<<<grid, 256, 0, tsr_cuda_call_stream(call)>>>(
        (const uint8_t *)src[0].data, src[0].nb[1], src[0].nb[2], (__half *)dst->data, S, n, H);
  tsr_cuda_call_finish((void *)host, call, what);
}

extern "C" TSR_PLUGIN_EXPORT void
example_codec_q8f_encode_cuda(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                              const struct tsr_tensor_info *src, int n_src, const int32_t *params) {
  (void)ith, (void)nth, (void)n_src, (void)params;
  launch_q8f(ctx, dst, src, true, "example_codec q8_f32 encode");
}

extern "C" TSR_PLUGIN_EXPORT void
example_codec_q8f_lift_cuda(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                            const struct tsr_tensor_info *src, int n_src, const int32_t *params) {
  (void)ith, (void)nth, (void)n_src, (void)params;
  launch_q8f(ctx, dst, src, false, "example_codec q8_f32 lift");
}

/* ---- q8_f32 read: attention over K and V stored in q8_f32 -------------- */

/* One warp a (q head, query): lane l holds dims l, l + 32, ... of q and of the
** output, so dim d of a row is value l of block d / 32 (its scale read by every
** lane). Keys one at a time with an online softmax: the flash op's semantics
** (tsr_kv_codec_kernels.read), without its tiling. */
__global__ void k_q8f_read(const char *q, int64_t q_nb0, int64_t q_nb1, int64_t q_nb2,
                           const uint8_t *k, int64_t k_nb1, int64_t k_nb2, const uint8_t *v,
                           int64_t v_nb1, int64_t v_nb2, const char *mask, int mask_f16,
                           int64_t m_nb0, int64_t m_nb1, const int32_t *q_pos, int64_t qp_nb0,
                           const int32_t *kv_pos, int64_t kp_nb0, char *out, int64_t o_nb0,
                           int64_t o_nb1, int64_t o_nb2, int64_t D, int64_t Dv, int64_t Nkv,
                           int64_t group, float scale, float softcap, int causal, int window) {
  const int64_t h = blockIdx.x, iq = blockIdx.y, hk = h / group;
  const int lane = threadIdx.x;
  const int nd = (int)(D / 32), ndv = (int)(Dv / 32);
  float qr[16], acc[16];
  for (int i = 0; i < nd; i++)
    qr[i] = *(const float *)(q + (lane + 32 * i) * q_nb0 + iq * q_nb1 + h * q_nb2);
  for (int i = 0; i < ndv; i++) acc[i] = 0.0f;
  const int32_t qp = q_pos ? *(const int32_t *)((const char *)q_pos + iq * qp_nb0) : 0;
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = 0; j < Nkv; j++) {
    float bias = 0.0f;
    if (mask) {
      const char *mp = mask + j * m_nb0 + iq * m_nb1;
      bias = mask_f16 ? __half2float(*(const __half *)mp) : *(const float *)mp;
    }
    if (kv_pos) {
      const int32_t kp = *(const int32_t *)((const char *)kv_pos + j * kp_nb0);
      if (kp < 0 || (causal && kp > qp) || (window > 0 && (int64_t)qp - kp >= window))
        bias = -INFINITY;
    }
    if (bias == -INFINITY) continue; /* uniform across the warp */
    const uint8_t *kr = k + j * k_nb1 + hk * k_nb2;
    float s = 0.0f;
    for (int i = 0; i < nd; i++) {
      float d;
      memcpy(&d, kr + i * Q8F_BYTES, 4);
      s += qr[i] * d * (float)(int8_t)kr[i * Q8F_BYTES + 4 + lane];
    }
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    float x = s * scale;
    if (softcap > 0.0f) x = softcap * tanhf(x / softcap);
    x += bias;
    const float m_new = fmaxf(m, x), corr = expf(m - m_new), p = expf(x - m_new);
    l = l * corr + p;
    const uint8_t *vr = v + j * v_nb1 + hk * v_nb2;
    for (int i = 0; i < ndv; i++) {
      float d;
      memcpy(&d, vr + i * Q8F_BYTES, 4);
      acc[i] = acc[i] * corr + p * d * (float)(int8_t)vr[i * Q8F_BYTES + 4 + lane];
    }
    m = m_new;
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f; /* a fully hidden row gives zeros */
  for (int i = 0; i < ndv; i++)
    *(float *)(out + (lane + 32 * i) * o_nb0 + h * o_nb1 + iq * o_nb2) = acc[i] * inv;
}

extern "C" TSR_PLUGIN_EXPORT void
example_codec_q8f_read_cuda(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                            const struct tsr_tensor_info *src, int n_src, const int32_t *params) {
  (void)ith, (void)nth, (void)n_src;
  const struct tsr_host *host = (const struct tsr_host *)ctx;
  struct tsr_device_call *call = tsr_cuda_call_begin((void *)host);
  const struct tsr_tensor_info *q = &src[0], *k = &src[1], *v = &src[2], *mask = &src[3];
  const int64_t D = q->ne[0], Nq = q->ne[1], Hq = q->ne[2], Dv = v->ne[0];
  if (Nq <= 0 || Hq <= 0) return;
  float scale, softcap;
  memcpy(&scale, &params[0], 4);
  memcpy(&softcap, &params[1], 4);
  k_q8f_read<<<dim3((unsigned)Hq, (unsigned)Nq), 32, 0, tsr_cuda_call_stream(call)>>>(
      (const char *)q->data, q->nb[0], q->nb[1], q->nb[2], (const uint8_t *)k->data, k->nb[1],
      k->nb[2], (const uint8_t *)v->data, v->nb[1], v->nb[2], (const char *)mask->data,
      mask->dtype == TSR_DTYPE_ID_F16, mask->nb[0], mask->nb[1], (const int32_t *)src[4].data,
      src[4].nb[0],
      (const int32_t *)src[5].data, src[5].nb[0], (char *)dst->data, dst->nb[0], dst->nb[1],
      dst->nb[2], D, Dv, k->ne[1], Hq / k->ne[2], scale, softcap, params[2] != 0, params[3]);
  tsr_cuda_call_finish((void *)host, call, "example_codec q8_f32 read");
}
