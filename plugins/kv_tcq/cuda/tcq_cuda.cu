/*
** kv_tcq's kernels on the cuda backend (kv_tcq_cuda.so, opened by the host only on
** a cuda run); formats are tcq.h's, semantics (and arithmetic) kv_tcq.c's.
**   rotate:  kv_turbo's (../../kv_turbo/cuda/rotation.cuh);
**   encode:  one warp a block of 64 values (a lane two), 8 warps a block of threads and
**            no block barrier: the norm from a warp sum in f64 (kv_tcq.c's lane_sum
**            order), then the Viterbi in f32 with kv_tcq.c's roundings (no fused
**            multiply-add) and tie rules, so the bytes are the CPU reference's. A lane
**            holds the costs of 16 (turbo3_tcq) or 8 (turbo2_tcq) consecutive states:
**            the predecessors of low bits m, (m << k) | p, are 2^k consecutive states,
**            so a lane takes the minima of m = 2 lane and 2 lane + 1 alone, the warp
**            trades the 64 minima through its own shared memory (one __syncwarp a
**            step) and keeps its back pointers there (64 steps x 64 bytes); the final
**            state by a warp argmin, the path traced back by one lane, the steps packed
**            by shuffles, the scale from a second warp sum in f64;
**   lift:    one warp a block, to f16 (the block's f16 scale times codebook[s_t]), the
**            CPU's decode_f16 bit for bit (a NaN block's NaN too);
**   read:    codec_read.cuh's flash over K and V in these tiers. One query against a group
**            of at most 8 q heads with value head dims of 128, 256 or 512 runs the
**            GPU's GQA decode kernel (tessera/cuda_attn_gqa.cuh) reading the blocks in
**            register: a pair of values is two states from one three-byte window, their
**            codebook entries as f16 times the block's scale in f16, exactly what the
**            lift writes (but a NaN block's values, the GPU's own NaN); rows end to end
**            are staged through shared memory a step ahead (the kernel's cp.async
**            variant); the keys are split over the multiprocessors and merged.
**            Anything else (prefill, several queries) lifts K and V into the call's
**            scratch and runs the shared tile and tensor-core kernels on f16.
*/
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "tessera/cuda_attn_tile.cuh"
#include "tessera/plugin_cuda.h"

#include "../tcq.h"
#include "../../kv_turbo/cuda/codec_read.cuh"
#include "../../kv_turbo/cuda/rotation.cuh"
#include "tcq_codebooks.h"

/* the tiers' codebooks (f16-exact floats), indexed by state */
__device__ const float d_book2[256] = {TCQ2_CODEBOOK}, d_book3[512] = {TCQ3_CODEBOOK};

template <int K> __device__ static inline const float *book() { return K == 2 ? d_book2 : d_book3; }

/* the states s_e, s_{e+1} (e even, 0..62) of a block of steps of K bits: tcq_state's,
** both from the three bytes at the first one's window (inside the block: the scale
** follows the steps) */
template <int K>
__device__ static inline void pair_states(const uint8_t *o, int e, int *s0, int *s1) {
  constexpr int MASK = (1 << (K + TCQ_LOW_BITS)) - 1;
  const int pos = K * e - TCQ_LOW_BITS, byte = pos < 0 ? 0 : pos >> 3;
  const uint32_t w = (uint32_t)o[byte] | (uint32_t)o[byte + 1] << 8 | (uint32_t)o[byte + 2] << 16;
  const uint32_t x = pos < 0 ? w << -pos : w >> (pos & 7); /* bit i: stream bit pos + i */
  *s0 = (int)(x & MASK), *s1 = (int)(x >> K & MASK);
}

/* ---- rotation ------------------------------------------------------------------ */

extern "C" TSR_PLUGIN_EXPORT void
kv_tcq_rotate_cuda(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                   const struct tsr_tensor_info *src, int n_src, const int32_t *params) {
  (void)ctx, (void)ith, (void)nth, (void)n_src;
  const struct tcq_state *st = tcq_state_of(params);
  turbo_rotate_entry((const struct tsr_host *)st->host, (struct tsr_plugin *)st->self, dst, src,
                     params, "kv_tcq rotate");
}

/* ---- encode and lift --------------------------------------------------------------- */

/* warps (blocks of 64 values) a block of threads of the encoder and the lift */
#define TCQ_WARPS 8

/* rows [S, n, H] f32 (strided: rb0, rb1, rb2 bytes) -> the cache's cells (a cell per row,
** or per row and head when cells is [n, H]; cb0, cb1 bytes). kv_tcq.c's encode_block with
** its f32 Viterbi, warp-synchronous: shared memory is the warp's own. */
template <int K>
__global__ void __launch_bounds__(32 * TCQ_WARPS)
    k_encode(const char *rows, size_t rb0, size_t rb1, size_t rb2, const char *cells, size_t cb0,
             size_t cb1, bool cell_per_head, uint8_t *cache, size_t nb1, size_t nb2, int64_t S,
             int64_t n, int64_t H) {
  constexpr unsigned ALL = 0xffffffffu;
  constexpr int STREAM = TCQ_BLOCK * K / 8, BYTES = STREAM + 2;
  constexpr int NP = 1 << K;  /* predecessors of a state, and successors */
  constexpr int PER = 2 * NP; /* states a lane: NS / 32, those of m = 2 lane, 2 lane + 1 */
  /* a warp's minima of the step (two buffers, one __syncwarp a step), back pointers
  ** back[t][m] (the p of the predecessor (m << K) | p), and the path's states */
  __shared__ __align__(16) float s_best[TCQ_WARPS][2][64];
  __shared__ __align__(16) uint8_t s_back[TCQ_WARPS][TCQ_BLOCK][64];
  __shared__ __align__(16) uint16_t s_path[TCQ_WARPS][TCQ_BLOCK];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t block = (int64_t)blockIdx.x * TCQ_WARPS + warp;
  const int64_t per_row = S / TCQ_BLOCK, total = per_row * n * H;
  if (block >= total) return; /* whole warps: total counts warps */
  const int64_t b = block % per_row, i = block / per_row % n, h = block / per_row / n;
  const int32_t cell = *(const int32_t *)(cells + i * cb0 + (cell_per_head ? h * cb1 : 0));
  uint8_t *o = cache + (size_t)cell * nb1 + (size_t)h * nb2 + (size_t)b * BYTES;

  /* the norm: lane_sum's order, in f64 (every lane ends with the same sum) */
  const char *y = rows + (b * TCQ_BLOCK + 2 * lane) * rb0 + i * rb1 + h * rb2;
  const float y0 = *(const float *)y, y1 = *(const float *)(y + rb0);
  double ss = __dadd_rn(__dmul_rn((double)y0, (double)y0), __dmul_rn((double)y1, (double)y1));
  for (int off = 16; off; off >>= 1) ss = __dadd_rn(ss, __shfl_xor_sync(ALL, ss, off));
  const double norm = __dsqrt_rn(ss);
  if (!isfinite(norm) || !(norm > 0.0)) { /* the same for the whole warp */
    /* zero steps; the scale 0, or a NaN (kv_tcq.c's (_Float16)NAN, 0x7e00) */
    if (lane < STREAM) o[lane] = 0;
    if (lane == 0) o[STREAM] = 0, o[STREAM + 1] = isfinite(norm) ? 0 : 0x7e;
    return;
  }
  const double inv = __ddiv_rn(8.0, norm);
  const float u0 = __double2float_rn(__dmul_rn((double)y0, inv));
  const float u1 = __double2float_rn(__dmul_rn((double)y1, inv));

  /* the Viterbi: this lane's states lane PER + j (j < PER), from s_{-1} = 0 */
  const float *bk = book<K>();
  float cost[PER], c[PER];
#pragma unroll
  for (int j = 0; j < PER; j++) {
    c[j] = bk[lane * PER + j];
    cost[j] = lane == 0 && j == 0 ? 0.0f : INFINITY;
  }
  const int m_lo = lane * PER & 63; /* the low bits of this lane's first state */
  for (int t = 0; t < TCQ_BLOCK; t++) {
    const float ut = __shfl_sync(ALL, t & 1 ? u1 : u0, t >> 1);
    /* minima over the predecessors of m = 2 lane (cost[0 .. NP)) and 2 lane + 1
    ** (cost[NP .. 2 NP)): strict <, so a tie keeps the lowest p */
    float b0 = cost[0], b1 = cost[NP];
    int a0 = 0, a1 = 0;
#pragma unroll
    for (int p = 1; p < NP; p++) {
      if (cost[p] < b0) b0 = cost[p], a0 = p;
      if (cost[NP + p] < b1) b1 = cost[NP + p], a1 = p;
    }
    float *best = s_best[warp][t & 1];
    *reinterpret_cast<float2 *>(best + 2 * lane) = make_float2(b0, b1);
    *reinterpret_cast<uint16_t *>(&s_back[warp][t][2 * lane]) = (uint16_t)(a0 | a1 << 8);
    __syncwarp();
    /* cost[s] = best[s & 63] + (u_t - book[s])^2, rounded as kv_tcq.c's f32 rounds */
#pragma unroll
    for (int j = 0; j < PER; j += 4) {
      const float4 bm = *reinterpret_cast<const float4 *>(best + m_lo + j);
      const float bv[4] = {bm.x, bm.y, bm.z, bm.w};
#pragma unroll
      for (int q = 0; q < 4; q++) {
        const float d = __fsub_rn(ut, c[j + q]);
        cost[j + q] = __fadd_rn(bv[q], __fmul_rn(d, d));
      }
    }
  }

  /* the final state: the lowest cost, the lowest index on ties */
  float bv = cost[0];
  int bs = lane * PER;
#pragma unroll
  for (int j = 1; j < PER; j++)
    if (cost[j] < bv) bv = cost[j], bs = lane * PER + j;
  for (int off = 16; off; off >>= 1) {
    const float ov = __shfl_xor_sync(ALL, bv, off);
    const int os = __shfl_xor_sync(ALL, bs, off);
    if (ov < bv || (ov == bv && os < bs)) bv = ov, bs = os;
  }
  /* the path, traced back by one lane (the back pointers were written before the last
  ** step's __syncwarp) */
  if (lane == 0) {
    int s = bs;
    for (int t = TCQ_BLOCK - 1; t >= 0; t--) {
      s_path[warp][t] = (uint16_t)s;
      s = (s & 63) << K | s_back[warp][t][s & 63];
    }
  }
  __syncwarp();
  const int s0 = s_path[warp][2 * lane], s1 = s_path[warp][2 * lane + 1];

  /* the steps o_t = s_t >> 6 at stream bit K t: a lane's two are 2 K bits at bit 2 K lane,
  ** four lanes' are K whole bytes */
  const uint32_t chunk = (uint32_t)(s0 >> TCQ_LOW_BITS) | (uint32_t)(s1 >> TCQ_LOW_BITS) << K;
  const uint32_t w = chunk | __shfl_down_sync(ALL, chunk, 1) << 2 * K |
                     __shfl_down_sync(ALL, chunk, 2) << 4 * K |
                     __shfl_down_sync(ALL, chunk, 3) << 6 * K;
  if (lane % 4 == 0)
#pragma unroll
    for (int q = 0; q < K; q++) o[K * (lane / 4) + q] = (uint8_t)(w >> 8 * q);

  /* the scale |y| / |codebook[s_0..63]|: lane_sum's order in f64, one rounding to f16 */
  const double c0 = bk[s0], c1 = bk[s1];
  double cc = __dadd_rn(__dmul_rn(c0, c0), __dmul_rn(c1, c1));
  for (int off = 16; off; off >>= 1) cc = __dadd_rn(cc, __shfl_xor_sync(ALL, cc, off));
  if (lane == 0) {
    const unsigned short bits =
        cc > 0.0 ? __half_as_ushort(__double2half(__ddiv_rn(norm, __dsqrt_rn(cc)))) : 0;
    o[STREAM] = (uint8_t)(bits & 0xff), o[STREAM + 1] = (uint8_t)(bits >> 8);
  }
}

/* a view of the cache [S, n, H] (strided) -> f16 [S, n, H] contiguous: kv_tcq.c's
** decode_f16 (the f16 scale as f32 times codebook[s_t], rounded to f16) */
template <int K>
__global__ void __launch_bounds__(32 * TCQ_WARPS)
    k_lift(const uint8_t *src, size_t nb1, size_t nb2, __half *dst, int64_t S, int64_t n,
           int64_t H) {
  constexpr int STREAM = TCQ_BLOCK * K / 8, BYTES = STREAM + 2;
  const int64_t block = (int64_t)blockIdx.x * TCQ_WARPS + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t per_row = S / TCQ_BLOCK, total = per_row * n * H;
  if (block >= total) return;
  const int64_t b = block % per_row, i = block / per_row % n, h = block / per_row / n;
  const uint8_t *o = src + (size_t)i * nb1 + (size_t)h * nb2 + (size_t)b * BYTES;
  const unsigned short bits = (unsigned short)(o[STREAM] | o[STREAM + 1] << 8);
  const float s = __half2float(__ushort_as_half(bits));
  int s0, s1;
  pair_states<K>(o, 2 * lane, &s0, &s1);
  const float *bk = book<K>();
  __half2 v = __floats2half2_rn(__fmul_rn(s, bk[s0]), __fmul_rn(s, bk[s1]));
  if ((bits & 0x7fff) > 0x7c00) /* a NaN scale: the CPU's values, that NaN quieted (not the
                                ** GPU's canonical NaN) */
    v = __half2half2(__ushort_as_half((unsigned short)(bits | 0x200)));
  *reinterpret_cast<__half2 *>(dst + (h * n + i) * S + b * TCQ_BLOCK + 2 * lane) = v;
}

template <int K>
static void launch_lift(const uint8_t *src, size_t nb1, size_t nb2, __half *dst, int64_t S,
                        int64_t n, int64_t H, cudaStream_t stream) {
  const int64_t blocks = S / TCQ_BLOCK * n * H;
  if (blocks > 0)
    k_lift<K><<<(unsigned)((blocks + TCQ_WARPS - 1) / TCQ_WARPS), 32 * TCQ_WARPS, 0, stream>>>(
        src, nb1, nb2, dst, S, n, H);
}

template <int K>
static void encode_or_lift(void *ctx, const struct tsr_tensor_info *dst,
                           const struct tsr_tensor_info *src, bool encode) {
  const struct tsr_host *host = (const struct tsr_host *)((const struct tcq_cuda_ctx *)ctx)->host;
  struct tsr_device_call *call = tsr_cuda_call_begin((void *)host);
  const cudaStream_t stream = tsr_cuda_call_stream(call);
  const struct tsr_tensor_info *rows = encode ? &src[0] : dst;
  const int64_t S = rows->ne[0], n = rows->ne[1], H = rows->ne[2];
  const int64_t blocks = S / TCQ_BLOCK * n * H;
  if (blocks > 0) {
    if (encode)
      k_encode<K><<<(unsigned)((blocks + TCQ_WARPS - 1) / TCQ_WARPS), 32 * TCQ_WARPS, 0, stream>>>(
          (const char *)src[0].data, src[0].nb[0], src[0].nb[1], src[0].nb[2],
          (const char *)src[1].data, src[1].nb[0], src[1].nb[1], src[1].ne[1] > 1,
          (uint8_t *)dst->data, dst->nb[1], dst->nb[2], S, n, H);
    else
      launch_lift<K>((const uint8_t *)src[0].data, src[0].nb[1], src[0].nb[2],
                     (__half *)dst->data, S, n, H, stream);
  }
  tsr_cuda_call_finish((void *)host, call, encode ? "kv_tcq encode" : "kv_tcq lift");
}

#define ENTRIES(K)                                                                            \
  extern "C" TSR_PLUGIN_EXPORT void kv_tcq_encode##K##_cuda(                                  \
      void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,                         \
      const struct tsr_tensor_info *src, int n_src, const int32_t *params) {                  \
    (void)ith, (void)nth, (void)n_src, (void)params;                                          \
    encode_or_lift<K>(ctx, dst, src, true);                                                   \
  }                                                                                           \
  extern "C" TSR_PLUGIN_EXPORT void kv_tcq_lift##K##_cuda(                                    \
      void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,                         \
      const struct tsr_tensor_info *src, int n_src, const int32_t *params) {                  \
    (void)ith, (void)nth, (void)n_src, (void)params;                                          \
    encode_or_lift<K>(ctx, dst, src, false);                                                  \
  }
ENTRIES(2)
ENTRIES(3)

/* ---- read ----------------------------------------------------------------------------- */

/* The GQA decode kernel's type ids of the tiers (apart from kv_turbo's), and their pairs of
** values in register. */
#define TCQ_T(K) (TSR_GQA_CODEC_TYPES + 32 + (K))

template <int K> struct tcq_pair {
  CU_HD static inline uint32_t pair(const char *row, int64_t e) {
#ifdef __CUDA_ARCH__
    constexpr int STREAM = TCQ_BLOCK * K / 8, BYTES = STREAM + 2;
    const uint8_t *o = reinterpret_cast<const uint8_t *>(row) + e / TCQ_BLOCK * BYTES;
    int s0, s1;
    pair_states<K>(o, (int)(e % TCQ_BLOCK), &s0, &s1); /* e even */
    const float *bk = book<K>();
    const __half2 c = __floats2half2_rn(bk[s0], bk[s1]); /* exact: f16-exact codebooks */
    const __half2 v = __hmul2(c, __half2half2(*reinterpret_cast<const __half *>(o + STREAM)));
    return *reinterpret_cast<const uint32_t *>(&v);
#else
    (void)row, (void)e;
    return 0;
#endif
  }
};
template <> struct tsr_gqa_reader<TCQ_T(2)> : tcq_pair<2> {};
template <> struct tsr_gqa_reader<TCQ_T(3)> : tcq_pair<3> {};

/* k of the tier whose dtype the host assigned, 0 for none */
static int bits_of(const tcq_cuda_ctx *tc, int32_t dtype) {
  for (int t = 0; t < TCQ_TIERS; t++)
    if (tc->dtype[t] == dtype) return tcq_step_bits(t);
  return 0;
}

/* Whether the decode takes the GQA kernel's staged variant (TSR_ATTN_GQA_DECODE_DEFAULT, 2):
** K and V rows end to end from a 16-byte aligned start, so a step's 16 rows are one span of
** bytes each warp copies by cp.async while it computes the step before, and two steps a
** warp fit in shared memory. */
static bool staged(const tsr_tile_args *t, int kb, int vb) {
  auto rows = [](int k, int64_t d, int64_t nb1, const char *p) {
    return d % TCQ_BLOCK == 0 && nb1 == d / TCQ_BLOCK * tcq_block_bytes(k) && !((uintptr_t)p & 15);
  };
  return t->gqa_decode == 2 && rows(kb, t->D, t->k_nb1, t->k) &&
         rows(vb, t->Dv, t->v_nb1, t->v) && tsr_gqa_smem(t, 1, true) <= TSR_MMA_SMEM_MAX;
}

template <int KB, int VB>
static cudaError_t gqa(const tsr_tile_args *t, cudaStream_t stream) {
  if (staged(t, KB, VB))
    return tsr_gqa_decode_run<tsr_one_band, TCQ_T(KB), TCQ_T(VB), true>(t, tsr_one_band{},
                                                                       stream);
  return tsr_gqa_decode_run<tsr_one_band, TCQ_T(KB), TCQ_T(VB), false>(t, tsr_one_band{},
                                                                      stream);
}

template <int KB>
static cudaError_t gqa_k(int vb, const tsr_tile_args *t, cudaStream_t stream) {
  if (vb == 2) return gqa<KB, 2>(t, stream);
  return gqa<KB, 3>(t, stream);
}

static void lift_any(int k, const struct tsr_tensor_info *x, __half *out, cudaStream_t s) {
  const uint8_t *p = (const uint8_t *)x->data;
  const int64_t S = x->ne[0], n = x->ne[1], H = x->ne[2];
  if (k == 2) launch_lift<2>(p, x->nb[1], x->nb[2], out, S, n, H, s);
  else launch_lift<3>(p, x->nb[1], x->nb[2], out, S, n, H, s);
}

struct tcq_codec {
  static constexpr const char *name = "kv_tcq read";
  static int tier(const void *ctx, int32_t dtype) {
    return bits_of((const tcq_cuda_ctx *)ctx, dtype);
  }
  static int type(int k) { return TCQ_T(k); }
  static cudaError_t ready(int device) { /* the books are static tables */
    (void)device;
    return cudaSuccess;
  }
  static cudaError_t gqa(int kb, int vb, const tsr_tile_args *t, cudaStream_t stream) {
    return kb == 2 ? gqa_k<2>(vb, t, stream) : gqa_k<3>(vb, t, stream);
  }
  static void lift(int k, const struct tsr_tensor_info *x, __half *out, cudaStream_t s) {
    lift_any(k, x, out, s);
  }
};

extern "C" TSR_PLUGIN_EXPORT void
kv_tcq_read_cuda(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                 const struct tsr_tensor_info *src, int n_src, const int32_t *params) {
  (void)ith, (void)nth, (void)n_src;
  codec_read<tcq_codec>(ctx, (const struct tsr_host *)((const tcq_cuda_ctx *)ctx)->host, dst,
                        src, params);
}
