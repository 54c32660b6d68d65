/*
** kv_turbo's kernels on the cuda backend (kv_turbo_cuda.so, opened by the host
** only on a cuda run); formats are turbo.h's, semantics kv_turbo.c's.
**   rotate:  rotation.cuh;
**   encode:  one warp a block of 64 values (a lane two), the norm and the
**            centroids' norm from warp sums, indices packed by shuffles and ballots;
**   lift:    one warp a block, to f16 (the rotated values, s times the centroid);
**   read:    codec_read.cuh's flash over turbo K and V. One query against a group of at
**            most 8 q heads with value head dims of 128, 256 or 512 runs the GPU's
**            GQA decode kernel (tessera/cuda_attn_gqa.cuh) reading the blocks in
**            register: each pair of values is two centroids (one load from a pair
**            table) times the block's scale, in f16, exactly what the lift writes;
**            rows end to end are staged through shared memory a step ahead (the
**            kernel's cp.async variant); the keys are split over the
**            multiprocessors and merged. Anything else (prefill, several
**            queries) lifts K and V into the call's scratch and runs the shared
**            tile and tensor-core kernels on f16.
*/
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "tessera/cuda_attn_tile.cuh"
#include "tessera/plugin_cuda.h"

#include "../turbo.h"
#include "codec_read.cuh"
#include "rotation.cuh"
#include "../turbo_centroids.h"

/* the tiers' centroids (f16-exact) and the boundaries between them */
__constant__ float c_mid2[3], c_mid3[7], c_mid4[15], c_mid8[255];
__device__ const float d_cent2[4] = {TURBO2_CENTROIDS}, d_cent3[8] = {TURBO3_CENTROIDS},
                       d_cent4[16] = {TURBO4_CENTROIDS}, d_cent8[256] = {TURBO8_CENTROIDS};

template <int B> __device__ static inline const float *cent() {
  return B == 2 ? d_cent2 : B == 3 ? d_cent3 : B == 4 ? d_cent4 : d_cent8;
}
template <int B> __device__ static inline float mid_uniform(int i) {
  return B == 2 ? c_mid2[i] : B == 3 ? c_mid3[i] : B == 4 ? c_mid4[i] : c_mid8[i];
}

/* the decode's pairs of values, so a pair of indices costs one load: f16 centroids i0 (low)
** and i1 (high) as a half2's bits, at i0 | i1 << B */
__device__ uint32_t d_pair2[16], d_pair3[64], d_pair4[256];

/* the midpoints and pair tables, once a device (the first call of a process on it runs
** eagerly: a capture only follows a compute of the same graph) */
static bool g_ready[64];
static cudaError_t ready(int device) {
  if (device >= 0 && device < 64 && g_ready[device]) return cudaSuccess;
  static const float c2[] = {TURBO2_CENTROIDS}, c3[] = {TURBO3_CENTROIDS},
                     c4[] = {TURBO4_CENTROIDS}, c8[] = {TURBO8_CENTROIDS};
  float m[255];
  cudaError_t e = cudaSuccess;
  auto put = [&](const void *sym, const float *c, int n) {
    for (int i = 0; i + 1 < n; i++) m[i] = (c[i] + c[i + 1]) / 2;
    if (e == cudaSuccess) e = cudaMemcpyToSymbol(sym, m, sizeof(float) * (size_t)(n - 1));
  };
  put(c_mid2, c2, 4), put(c_mid3, c3, 8), put(c_mid4, c4, 16), put(c_mid8, c8, 256);
  uint32_t pairs[256];
  auto pair = [&](const void *sym, const float *c, int bits) {
    for (int i = 0; i < 1 << (2 * bits); i++) {
      const __half2 h = __floats2half2_rn(c[i & ((1 << bits) - 1)], c[i >> bits]);
      memcpy(&pairs[i], &h, 4);
    }
    if (e == cudaSuccess) e = cudaMemcpyToSymbol(sym, pairs, sizeof(uint32_t) << (2 * bits));
  };
  pair(d_pair2, c2, 2), pair(d_pair3, c3, 3), pair(d_pair4, c4, 4);
  if (e == cudaSuccess && device >= 0 && device < 64) g_ready[device] = true;
  return e;
}

/* ---- rotation ------------------------------------------------------------------ */

extern "C" TSR_PLUGIN_EXPORT void
kv_turbo_rotate_cuda(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                     const struct tsr_tensor_info *src, int n_src, const int32_t *params) {
  (void)ctx, (void)ith, (void)nth, (void)n_src;
  const struct turbo_state *st = turbo_state_of(params);
  turbo_rotate_entry((const struct tsr_host *)st->host, (struct tsr_plugin *)st->self, dst, src,
                     params, "kv_turbo rotate");
}

/* ---- encode and lift --------------------------------------------------------------- */

/* rows [S, n, H] f32 (strided: rb0, rb1, rb2 bytes) -> the cache's cells (a cell per row,
** or per row and head when cells is [n, H]; cb0, cb1 bytes) */
template <int B>
__global__ void k_encode(const char *rows, size_t rb0, size_t rb1, size_t rb2, const char *cells,
                         size_t cb0, size_t cb1, bool cell_per_head, uint8_t *cache, size_t nb1,
                         size_t nb2, int64_t S, int64_t n, int64_t H) {
  constexpr unsigned ALL = 0xffffffffu;
  constexpr int BYTES = 2 + TURBO_BLOCK * B / 8;
  const int64_t block = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t per_row = S / TURBO_BLOCK, total = per_row * n * H;
  if (block >= total) return; /* whole warps: total counts warps */
  const int64_t b = block % per_row, i = block / per_row % n, h = block / per_row / n;
  const char *y = rows + (b * TURBO_BLOCK + 2 * lane) * rb0 + i * rb1 + h * rb2;
  const float y0 = *(const float *)y, y1 = *(const float *)(y + rb0);
  float ss = y0 * y0 + y1 * y1;
  for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(ALL, ss, o);
  const float norm = sqrtf(ss), inv = norm > 0.0f ? 8.0f / norm : 0.0f;
  const float u0 = y0 * inv, u1 = y1 * inv;
  int i0 = 0, i1 = 0; /* how many boundaries lie below: the nearest centroid, ties low */
  for (int k = 0; k < (1 << B) - 1; k++) {
    const float m = mid_uniform<B>(k);
    i0 += u0 > m, i1 += u1 > m;
  }
  const float c0 = cent<B>()[i0], c1 = cent<B>()[i1];
  float cc = c0 * c0 + c1 * c1;
  for (int o = 16; o; o >>= 1) cc += __shfl_xor_sync(ALL, cc, o);
  const float s = norm > 0.0f || norm != norm ? norm / sqrtf(cc) : 0.0f;
  const int32_t cell = *(const int32_t *)(cells + i * cb0 + (cell_per_head ? h * cb1 : 0));
  uint8_t *o = cache + (size_t)cell * nb1 + (size_t)h * nb2 + (size_t)b * BYTES;
  if (lane == 0) *reinterpret_cast<__half *>(o) = __float2half_rn(s);
  uint8_t *q = o + 2;
  if (B == 8) {
    q[2 * lane] = (uint8_t)i0, q[2 * lane + 1] = (uint8_t)i1;
  } else if (B == 4) {
    q[lane] = (uint8_t)(i0 | i1 << 4);
  } else {
    const int nib = (i0 & 3) | (i1 & 3) << 2, up = __shfl_down_sync(ALL, nib, 1);
    if (lane % 2 == 0) q[lane / 2] = (uint8_t)(nib | up << 4);
    if (B == 3) { /* the high bits: value 8 j + k of byte j is lane 4 j + k / 2's */
      const unsigned h0 = __ballot_sync(ALL, i0 >> 2), h1 = __ballot_sync(ALL, i1 >> 2);
      if (lane < 8) {
        unsigned byte = 0;
        for (int k = 0; k < 8; k++) byte |= ((k % 2 ? h1 : h0) >> (4 * lane + k / 2) & 1u) << k;
        q[16 + lane] = (uint8_t)byte;
      }
    }
  }
}

/* a view of the cache [S, n, H] (strided) -> f16 [S, n, H] contiguous */
template <int B>
__global__ void k_lift(const uint8_t *src, size_t nb1, size_t nb2, __half *dst, int64_t S,
                       int64_t n, int64_t H) {
  constexpr int BYTES = 2 + TURBO_BLOCK * B / 8;
  const int64_t block = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t per_row = S / TURBO_BLOCK, total = per_row * n * H;
  if (block >= total) return;
  const int64_t b = block % per_row, i = block / per_row % n, h = block / per_row / n;
  const uint8_t *o = src + (size_t)i * nb1 + (size_t)h * nb2 + (size_t)b * BYTES;
  const float s = __half2float(*reinterpret_cast<const __half *>(o));
  const float *c = cent<B>();
  const __half2 v = __floats2half2_rn(s * c[turbo_index(o, B, 2 * lane)],
                                      s * c[turbo_index(o, B, 2 * lane + 1)]);
  *reinterpret_cast<__half2 *>(dst + (h * n + i) * S + b * TURBO_BLOCK + 2 * lane) = v;
}

template <int B>
static void launch_lift(const uint8_t *src, size_t nb1, size_t nb2, __half *dst, int64_t S,
                        int64_t n, int64_t H, cudaStream_t stream) {
  const int64_t blocks = S / TURBO_BLOCK * n * H;
  if (blocks > 0)
    k_lift<B><<<(unsigned)((blocks + 7) / 8), 256, 0, stream>>>(src, nb1, nb2, dst, S, n, H);
}

template <int B>
static void encode_or_lift(void *ctx, const struct tsr_tensor_info *dst,
                           const struct tsr_tensor_info *src, bool encode) {
  const struct tsr_host *host =
      (const struct tsr_host *)((const struct turbo_cuda_ctx *)ctx)->host;
  struct tsr_device_call *call = tsr_cuda_call_begin((void *)host);
  const cudaStream_t stream = tsr_cuda_call_stream(call);
  cudaError_t e = ready(call ? call->device : 0);
  const struct tsr_tensor_info *rows = encode ? &src[0] : dst;
  const int64_t S = rows->ne[0], n = rows->ne[1], H = rows->ne[2];
  const int64_t blocks = S / TURBO_BLOCK * n * H;
  if (e == cudaSuccess && blocks > 0) {
    if (encode)
      k_encode<B><<<(unsigned)((blocks + 7) / 8), 256, 0, stream>>>(
          (const char *)src[0].data, src[0].nb[0], src[0].nb[1], src[0].nb[2],
          (const char *)src[1].data, src[1].nb[0], src[1].nb[1], src[1].ne[1] > 1,
          (uint8_t *)dst->data, dst->nb[1], dst->nb[2], S, n, H);
    else
      launch_lift<B>((const uint8_t *)src[0].data, src[0].nb[1], src[0].nb[2],
                     (__half *)dst->data, S, n, H, stream);
  }
  if (e != cudaSuccess && call)
    call->status = host->set_error(TSR_ERR_INTERNAL, "kv_turbo: centroid tables: %s",
                                   cudaGetErrorString(e));
  tsr_cuda_call_finish((void *)host, call, encode ? "kv_turbo encode" : "kv_turbo lift");
}

#define ENTRIES(B)                                                                            \
  extern "C" TSR_PLUGIN_EXPORT void kv_turbo_encode##B##_cuda(                                \
      void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,                         \
      const struct tsr_tensor_info *src, int n_src, const int32_t *params) {                  \
    (void)ith, (void)nth, (void)n_src, (void)params;                                          \
    encode_or_lift<B>(ctx, dst, src, true);                                                   \
  }                                                                                           \
  extern "C" TSR_PLUGIN_EXPORT void kv_turbo_lift##B##_cuda(                                  \
      void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,                         \
      const struct tsr_tensor_info *src, int n_src, const int32_t *params) {                  \
    (void)ith, (void)nth, (void)n_src, (void)params;                                          \
    encode_or_lift<B>(ctx, dst, src, false);                                                  \
  }
ENTRIES(2)
ENTRIES(3)
ENTRIES(4)
ENTRIES(8)

/* ---- read ----------------------------------------------------------------------------- */

/* The GQA decode kernel's type ids of the tiers, and their pairs of values in register. */
#define TURBO_T(B) (TSR_GQA_CODEC_TYPES + (B))

template <int B> struct turbo_pair {
  CU_HD static inline uint32_t pair(const char *row, int64_t e) {
#ifdef __CUDA_ARCH__
    constexpr int BYTES = 2 + TURBO_BLOCK * B / 8;
    const uint8_t *o = reinterpret_cast<const uint8_t *>(row) + e / TURBO_BLOCK * BYTES;
    const int i = (int)(e % TURBO_BLOCK); /* even */
    uint32_t bits; /* the pair's two centroids: one load from a pair table (turbo2/3/4) */
    if (B == 8) {
      const __half2 c = __floats2half2_rn(d_cent8[o[2 + i]], d_cent8[o[3 + i]]);
      memcpy(&bits, &c, 4);
    } else if (B == 4) {
      bits = d_pair4[o[2 + i / 2]];
    } else if (B == 2) {
      bits = d_pair2[o[2 + i / 4] >> (i % 4 * 2) & 15];
    } else {
      const int nib = o[2 + i / 4] >> (i % 4 * 2) & 15, hi = o[18 + i / 8] >> (i % 8);
      bits = d_pair3[(nib & 3) | (hi & 1) << 2 | (nib >> 2) << 3 | (hi & 2) << 4];
    }
    __half2 c;
    memcpy(&c, &bits, 4);
    const __half2 v = __hmul2(c, __half2half2(*reinterpret_cast<const __half *>(o)));
    return *reinterpret_cast<const uint32_t *>(&v);
#else
    (void)row, (void)e;
    return 0;
#endif
  }
};
template <> struct tsr_gqa_reader<TURBO_T(2)> : turbo_pair<2> {};
template <> struct tsr_gqa_reader<TURBO_T(3)> : turbo_pair<3> {};
template <> struct tsr_gqa_reader<TURBO_T(4)> : turbo_pair<4> {};
template <> struct tsr_gqa_reader<TURBO_T(8)> : turbo_pair<8> {};

static int bits_of(const turbo_cuda_ctx *tc, int32_t dtype) {
  static const int bits[4] = {2, 3, 4, 8};
  for (int t = 0; t < TURBO_TIERS; t++)
    if (tc->dtype[t] == dtype) return bits[t];
  return 0;
}

/* Whether the decode takes the GQA kernel's staged variant (TSR_ATTN_GQA_DECODE_DEFAULT, 2):
** K and V rows end to end from a 16-byte aligned start, so a step's 16 rows are one span of
** bytes each warp copies by cp.async while it computes the step before, and two steps a
** warp fit in shared memory. */
static bool staged(const tsr_tile_args *t, int kb, int vb) {
  auto rows = [](int bits, int64_t d, int64_t nb1, const char *p) {
    return d % TURBO_BLOCK == 0 && nb1 == d / TURBO_BLOCK * turbo_block_bytes(bits) &&
           !((uintptr_t)p & 15);
  };
  return t->gqa_decode == 2 && rows(kb, t->D, t->k_nb1, t->k) &&
         rows(vb, t->Dv, t->v_nb1, t->v) && tsr_gqa_smem(t, 1, true) <= TSR_MMA_SMEM_MAX;
}

template <int KB, int VB>
static cudaError_t gqa(const tsr_tile_args *t, cudaStream_t stream) {
  if (staged(t, KB, VB))
    return tsr_gqa_decode_run<tsr_one_band, TURBO_T(KB), TURBO_T(VB), true>(t, tsr_one_band{},
                                                                           stream);
  return tsr_gqa_decode_run<tsr_one_band, TURBO_T(KB), TURBO_T(VB), false>(t, tsr_one_band{},
                                                                          stream);
}

template <int KB>
static cudaError_t gqa_k(int vb, const tsr_tile_args *t, cudaStream_t stream) {
  switch (vb) {
  case 2: return gqa<KB, 2>(t, stream);
  case 3: return gqa<KB, 3>(t, stream);
  case 4: return gqa<KB, 4>(t, stream);
  default: return gqa<KB, 8>(t, stream);
  }
}

static void lift_any(int bits, const struct tsr_tensor_info *x, __half *out, cudaStream_t s) {
  const uint8_t *p = (const uint8_t *)x->data;
  const int64_t S = x->ne[0], n = x->ne[1], H = x->ne[2];
  switch (bits) {
  case 2: launch_lift<2>(p, x->nb[1], x->nb[2], out, S, n, H, s); break;
  case 3: launch_lift<3>(p, x->nb[1], x->nb[2], out, S, n, H, s); break;
  case 4: launch_lift<4>(p, x->nb[1], x->nb[2], out, S, n, H, s); break;
  default: launch_lift<8>(p, x->nb[1], x->nb[2], out, S, n, H, s);
  }
}

struct turbo_codec {
  static constexpr const char *name = "kv_turbo read";
  static int tier(const void *ctx, int32_t dtype) {
    return bits_of((const turbo_cuda_ctx *)ctx, dtype);
  }
  static int type(int bits) { return TURBO_T(bits); }
  static cudaError_t ready(int device) { return ::ready(device); }
  static cudaError_t gqa(int kb, int vb, const tsr_tile_args *t, cudaStream_t stream) {
    switch (kb) {
    case 2: return gqa_k<2>(vb, t, stream);
    case 3: return gqa_k<3>(vb, t, stream);
    case 4: return gqa_k<4>(vb, t, stream);
    default: return gqa_k<8>(vb, t, stream);
    }
  }
  static void lift(int bits, const struct tsr_tensor_info *x, __half *out, cudaStream_t s) {
    lift_any(bits, x, out, s);
  }
};

extern "C" TSR_PLUGIN_EXPORT void
kv_turbo_read_cuda(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                   const struct tsr_tensor_info *src, int n_src, const int32_t *params) {
  (void)ith, (void)nth, (void)n_src;
  codec_read<turbo_codec>(ctx, (const struct tsr_host *)((const turbo_cuda_ctx *)ctx)->host, dst,
                          src, params);
}
