/*
** The tiled attention kernel of the GPU, shared by the core's flash and
** attention plugins (attn_dca), in f32. Head dims in steps of 16 (every
** model here) go instead to the tensor-core kernel of
** tessera/cuda_attn_mma.cuh, which takes the same arguments and plan; this one
** serves the other head dims.
**
** A block takes a tile of rows of one KV head, a row being one (query, q head
** of that KV head's group), and one range of the keys: it stages 32 keys at a
** time in shared memory as f32 (each K/V element decoded once per block, by
** dq_rt of tessera/cuda_quant.cuh) and runs one online softmax per row. Lanes
** own keys for the logits and head dims for the output, so every step is a
** plain FMA over shared memory, and the q heads of a group share every K/V
** tile they read. When rows are too few to fill the GPU (decode), the keys are
** split over several blocks whose partial (max, sum, accumulator) a second
** kernel merges.
**
** Bands: every kernel here takes a band policy B, a template parameter whose
** value (its parameters) is the kernel's second argument. A query row is staged
** once per band (band b's from tsr_tile_q_of); the policy says which of them a
** visible key is scored against, from the key's and the query's positions, and
** a gain every score of the row is multiplied by (after the scale, before the
** softcap). A policy has
**   B::n                                 its bands, 1 .. TSR_TILE_MAX_BANDS
**   B::row row_of(int32_t qp)            per-row state from the query's position
**   float gain(int32_t qp)               the row's gain (1: none)
**   int band(const B::row &, int32_t kp) a key's band, 0 .. n - 1
**   B::span span_of(int32_t lo, int32_t hi)  state for the rows of a block whose
**                                        query positions lie in [lo, hi]
**   int uniform(const B::span &, int32_t kmin, int32_t kmax): the band every key
**                                        at a position in [kmin, kmax] has for each of
**                                        those rows, or -1 when they differ
** tsr_one_band (every key band 0, gain 1) is the core's flash: known at compile
** time, it folds the band branches away. A policy of several bands places keys
** by position, so without key positions (kv_pos NULL) no range is uniform.
**
** A key is hidden by an empty cell (kv_pos < 0), the future (causal), the
** window, or a -inf mask; a key tile hidden from every row of the block is
** skipped whole. A row that sees no key gives zeros, never NaN.
**
** Head dims up to 512. Prefill tiles hold 32 rows (16 past head dim 256, so
** three bands of rows and the K and V tiles fit the 227 KB of shared memory an
** sm_90 block may have); decode tiles hold 8.
*/
#ifndef TESSERA_CUDA_ATTN_TILE_CUH
#define TESSERA_CUDA_ATTN_TILE_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include <atomic>

#include "tessera/cuda_attn_args.cuh"

/* The one-band policy: every key scored against the one query row, no gain. */
struct tsr_one_band {
  static constexpr int n = 1;
  struct row {};
  struct span {};
  __device__ row row_of(int32_t) const { return {}; }
  __device__ float gain(int32_t) const { return 1.0f; }
  __device__ int band(const row &, int32_t) const { return 0; }
  __device__ span span_of(int32_t, int32_t) const { return {}; }
  __device__ int uniform(const span &, int32_t, int32_t) const { return 0; }
};

__device__ static inline int32_t tsr_tile_pos(const char *p, int64_t nb0, int64_t i) {
  return *reinterpret_cast<const int32_t *>(p + i * nb0);
}

/* Key positions of the tile j0 .. j0 + nk into kpos[tk] (-1 past nk), between
** two barriers: the previous tile is consumed before, every thread sees these
** after. */
__device__ static inline void tsr_tile_next_pos(const tsr_tile_args &a, int32_t *kpos, int tk,
                                                int64_t j0, int64_t nk) {
  __syncthreads();
  if (threadIdx.x < tk) {
    const int t = threadIdx.x;
    kpos[t] = t >= nk ? -1 : a.kv_pos ? tsr_tile_pos(a.kv_pos, a.kv_pos_nb0, j0 + t) : 0;
  }
  __syncthreads();
}

/* The lowest and highest position of the queries that rows r0 .. r0 + n_rows - 1
** hold (a query spans `group` rows); 0 without query positions. */
__device__ static inline void tsr_tile_q_range(const tsr_tile_args &a, int64_t r0, int64_t n_rows,
                                               int32_t *lo, int32_t *hi) {
  *lo = *hi = 0;
  if (!a.q_pos || n_rows <= 0) return;
  const int64_t i0 = r0 / a.group, i1 = (r0 + n_rows - 1) / a.group;
  *lo = *hi = tsr_tile_pos(a.q_pos, a.q_pos_nb0, i0);
  for (int64_t i = i0 + 1; i <= i1; i++) {
    const int32_t p = tsr_tile_pos(a.q_pos, a.q_pos_nb0, i);
    *lo = p < *lo ? p : *lo, *hi = p > *hi ? p : *hi;
  }
}

/* The keys of this block's split: [*lo, *hi). */
__device__ static inline void tsr_tile_split_keys(const tsr_tile_args &a, int64_t *lo, int64_t *hi) {
  *lo = (int64_t)blockIdx.z * a.per_split;
  *hi = *lo + a.per_split < a.Nkv ? *lo + a.per_split : a.Nkv;
}

/* Queries per warp: 8 rows for prefill (4 past head dim 256), 2 for decode. */
static inline int tsr_tile_qpw(const struct tsr_tile_args *a) {
  if (a->Nq * a->group < 32) return 2;
  return (a->D > a->Dv ? a->D : a->Dv) > 256 ? 4 : 8;
}

/* Dynamic shared memory of a launch: query rows per band (n_bands of them), K and V
** tiles, key positions. */
static inline size_t tsr_tile_smem(const struct tsr_tile_args *a, int n_bands) {
  return sizeof(float) * ((size_t)n_bands * TSR_TILE_WARPS * a->qpw * (size_t)a->D +
                          TSR_TILE_K * (size_t)(a->D + 1) + TSR_TILE_K * (size_t)a->Dv) +
         sizeof(int32_t) * TSR_TILE_K;
}

/* B: the band policy; VREG: output values per lane (Dv <= 32 VREG); QPW: rows per warp.
** grid (row tiles of one KV head, KV heads, key splits), 128 threads. */
template <class B, int VREG, int QPW>
__global__ void __launch_bounds__(32 * TSR_TILE_WARPS) tsr_tile_attn(tsr_tile_args a, B policy) {
  constexpr int TILE_R = TSR_TILE_WARPS * QPW;
  extern __shared__ float tsr_tile_smem_f[];
  const int64_t D = a.D, Dv = a.Dv, Dk = a.D + 1; /* K rows padded: lanes read column d */
  float *qs = tsr_tile_smem_f;                     /* [bands][TILE_R][D] */
  float *ks = qs + (size_t)B::n * TILE_R * D;      /* [TILE_K][D + 1] */
  float *vs = ks + TSR_TILE_K * Dk;                 /* [TILE_K][Dv] */
  int32_t *kpos = reinterpret_cast<int32_t *>(vs + TSR_TILE_K * Dv);
  __shared__ int32_t tile_live, q_max;

  const int64_t hk = blockIdx.y, r0 = (int64_t)blockIdx.x * TILE_R, G = a.group;
  const int64_t n_rows = a.Nq * G - r0 < TILE_R ? a.Nq * G - r0 : TILE_R;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int64_t j_lo, j_hi;
  tsr_tile_split_keys(a, &j_lo, &j_hi);

  /* row r of the tile: query (r0 + r) / G, q head hk G + (r0 + r) % G */
  for (int e = threadIdx.x; e < B::n * TILE_R * (int)D; e += blockDim.x) {
    int d, r;
    const int b = cu_divmod(cu_divmod(e, (int)D, &d), TILE_R, &r);
    const int64_t iq = (r0 + r) / G, h = hk * G + (r0 + r) % G;
    qs[e] = r < n_rows ? *reinterpret_cast<const float *>(tsr_tile_q_of(a, b) + iq * a.q_row +
                                                          h * a.q_head + d * a.q_nb0)
                       : 0.0f;
  }
  if (threadIdx.x == 0) {
    int32_t lo, hi;
    tsr_tile_q_range(a, r0, n_rows, &lo, &hi);
    q_max = hi;
  }

  /* per row of this warp: position, band state, gain, running max / sum / output */
  int32_t qp[QPW];
  typename B::row brow[QPW];
  float gain[QPW], m[QPW], l[QPW], acc[QPW][VREG];
#pragma unroll
  for (int w = 0; w < QPW; w++) {
    const int64_t r = warp * QPW + w, iq = (r0 + r) / G;
    qp[w] = a.q_pos && r < n_rows ? tsr_tile_pos(a.q_pos, a.q_pos_nb0, iq) : 0;
    brow[w] = policy.row_of(qp[w]);
    gain[w] = policy.gain(qp[w]);
    m[w] = -INFINITY, l[w] = 0.0f;
#pragma unroll
    for (int i = 0; i < VREG; i++) acc[w][i] = 0.0f;
  }
  const char *kbase = a.k + hk * a.k_nb2, *vbase = a.v + hk * a.v_nb2;

  for (int64_t j0 = j_lo; j0 < j_hi; j0 += TSR_TILE_K) {
    const int64_t nk = j_hi - j0 < TSR_TILE_K ? j_hi - j0 : TSR_TILE_K;
    tsr_tile_next_pos(a, kpos, TSR_TILE_K, j0, nk);
    if (threadIdx.x == 0) { /* a tile of empty cells, or wholly in every row's future */
      int live = 0;
      for (int t = 0; t < nk; t++)
        live |= kpos[t] >= 0 && (!a.kv_pos || !a.causal || kpos[t] <= q_max);
      tile_live = live;
    }
    __syncthreads();
    if (!tile_live) continue;
    for (int e = threadIdx.x; e < TSR_TILE_K * (int)D; e += blockDim.x) {
      int d;
      const int t = cu_divmod(e, (int)D, &d);
      ks[t * Dk + d] = kpos[t] >= 0 ? dq_rt(a.k_type, kbase + (j0 + t) * a.k_nb1, d, a.k_nb0) : 0;
    }
    for (int e = threadIdx.x; e < TSR_TILE_K * (int)Dv; e += blockDim.x) {
      int d;
      const int t = cu_divmod(e, (int)Dv, &d);
      vs[e] = kpos[t] >= 0 ? dq_rt(a.v_type, vbase + (j0 + t) * a.v_nb1, d, a.v_nb0) : 0;
    }
    __syncthreads();

    const int32_t kp = kpos[lane];
#pragma unroll
    for (int w = 0; w < QPW; w++) {
      const int64_t r = warp * QPW + w;
      if (r >= n_rows) break; /* the same for the whole warp */
      bool seen = kp >= 0;
      if (seen && a.kv_pos) {
        if (a.causal && kp > qp[w]) seen = false;
        if (a.window > 0 && (int64_t)qp[w] - kp >= a.window) seen = false;
      }
      float bias = 0.0f;
      if (seen && a.mask) {
        const char *p = a.mask + (r0 + r) / G * a.mask_nb1 + (j0 + lane) * a.mask_nb0;
        bias = a.mask_f16 ? __half2float(*reinterpret_cast<const __half *>(p))
                          : *reinterpret_cast<const float *>(p);
      }
      float x = -INFINITY;
      if (seen && bias != -INFINITY) {
        const int band = policy.band(brow[w], kp);
        const float *q = qs + ((size_t)band * TILE_R + r) * D;
        const float *kr = ks + lane * Dk;
        float dot = 0.0f;
        for (int64_t d = 0; d < D; d++) dot += q[d] * kr[d];
        x = dot * a.scale;
        if (gain[w] != 1.0f) x *= gain[w];
        if (a.softcap > 0.0f) x = a.softcap * tanhf(x / a.softcap);
        x += bias;
      }
      float tmax = x;
      for (int o = 16; o > 0; o >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
      if (tmax == -INFINITY) continue; /* nothing visible in this tile for this row */
      const float m_new = fmaxf(m[w], tmax);
      const float f = m[w] == -INFINITY ? 0.0f : expf(m[w] - m_new);
      const float p = x == -INFINITY ? 0.0f : expf(x - m_new);
      float psum = p;
      for (int o = 16; o > 0; o >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o);
      l[w] = l[w] * f + psum;
      m[w] = m_new;
#pragma unroll
      for (int i = 0; i < VREG; i++) acc[w][i] *= f;
      for (int t = 0; t < nk; t++) {
        const float pt = __shfl_sync(0xffffffffu, p, t);
        if (pt == 0.0f) continue; /* hidden or underflowed: its V row is not read */
        const float *vr = vs + t * Dv;
#pragma unroll
        for (int i = 0; i < VREG; i++)
          if (lane + 32 * i < Dv) acc[w][i] += pt * vr[lane + 32 * i];
      }
    }
  }

#pragma unroll
  for (int w = 0; w < QPW; w++) {
    const int64_t r = warp * QPW + w;
    if (r >= n_rows) break;
    const int64_t iq = (r0 + r) / G, h = hk * G + (r0 + r) % G;
    if (a.splits > 1) { /* the partial state; tsr_tile_combine merges the splits */
      float *pr = a.part + ((iq * a.Hq + h) * a.splits + blockIdx.z) * (Dv + 2);
      if (lane == 0) pr[0] = m[w], pr[1] = l[w];
#pragma unroll
      for (int i = 0; i < VREG; i++)
        if (lane + 32 * i < Dv) pr[2 + lane + 32 * i] = acc[w][i];
      continue;
    }
    const float inv = l[w] > 0.0f ? 1.0f / l[w] : 0.0f; /* no key: zeros */
    char *out = a.dst + iq * a.dst_row + h * a.dst_head;
#pragma unroll
    for (int i = 0; i < VREG; i++)
      if (lane + 32 * i < Dv)
        *reinterpret_cast<float *>(out + (lane + 32 * i) * a.dst_nb0) = acc[w][i] * inv;
  }
}

/* Merges the splits' partial states of one (query, head): grid Nq * Hq. */
__global__ void tsr_tile_combine(tsr_tile_args a) {
  const int64_t unit = blockIdx.x, iq = unit / a.Hq, h = unit % a.Hq, stride = a.Dv + 2;
  const float *pp = a.part + unit * a.splits * stride;
  float M = -INFINITY;
  for (int i = 0; i < a.splits; i++) M = fmaxf(M, pp[i * stride]);
  float L = 0.0f;
  for (int i = 0; i < a.splits; i++) {
    const float mi = pp[i * stride];
    if (mi != -INFINITY) L += pp[i * stride + 1] * expf(mi - M);
  }
  const float inv = L > 0.0f ? 1.0f / L : 0.0f;
  if (a.skip_below > 0.0f && a.counters && threadIdx.x == 0) { /* the row's dropped mass */
    const float *sp = tsr_tile_skip_part(a) + unit * a.splits;
    float S = 0.0f;
    for (int i = 0; i < a.splits; i++) {
      const float mi = pp[i * stride];
      if (mi != -INFINITY) S += sp[i] * expf(mi - M);
    }
    atomicAdd(&a.counters[2], 1ull);
    atomicAdd(&a.counters[3], (unsigned long long)llrintf(S * inv * 1e9f));
  }
  char *out = a.dst + iq * a.dst_row + h * a.dst_head;
  for (int64_t d = threadIdx.x; d < a.Dv; d += blockDim.x) {
    float v = 0.0f;
    for (int i = 0; i < a.splits; i++) {
      const float mi = pp[i * stride];
      if (mi != -INFINITY) v += pp[i * stride + 2 + d] * expf(mi - M);
    }
    *reinterpret_cast<float *>(out + d * a.dst_nb0) = v * inv;
  }
}

/* Launches K over a plan's grid (row tiles of `rows`, KV heads, key splits), blocks of
** `threads`, with smem bytes of dynamic shared memory and the band policy `policy`, then
** the merge of split partials. The shared memory past 48 KB is asked of the driver once
** per kernel, device and larger size, not at every launch: every attention layer of
** every step comes through here. */
#define TSR_ATTN_MAX_DEVICES 16
template <auto K, class B>
static inline cudaError_t tsr_attn_run(const struct tsr_tile_args *a, const B &policy, int64_t rows,
                                       size_t smem, cudaStream_t stream,
                                       int threads = 32 * TSR_TILE_WARPS) {
  static std::atomic<size_t> granted[TSR_ATTN_MAX_DEVICES];
  int dev = -1;
  (void)cudaGetDevice(&dev);
  const bool cached = dev >= 0 && dev < TSR_ATTN_MAX_DEVICES;
  if (!cached || smem > granted[dev].load(std::memory_order_relaxed)) {
    const cudaError_t e =
        cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) {
      (void)cudaGetLastError(); /* not sticky: clear it, so the caller's own launch reports its own */
      return e;
    }
    if (cached) {
      size_t g = granted[dev].load(std::memory_order_relaxed);
      while (g < smem && !granted[dev].compare_exchange_weak(g, smem)) {
      }
    }
  }
  const dim3 grid((unsigned)((a->Nq * a->group + rows - 1) / rows), (unsigned)(a->Hq / a->group),
                  (unsigned)a->splits);
  K<<<grid, threads, smem, stream>>>(*a, policy);
  if (a->splits > 1) tsr_tile_combine<<<(unsigned)(a->Nq * a->Hq), 128, 0, stream>>>(*a);
  return cudaGetLastError();
}

#include "tessera/cuda_attn_mma.cuh"
#include "tessera/cuda_attn_gqa.cuh"

/* Picks the row tile and the key splits for n_sm multiprocessors; returns the
** bytes of a->part the launch needs (0: none). */
static inline size_t tsr_tile_attn_plan(struct tsr_tile_args *a, int n_sm) {
  a->qpw = tsr_tile_qpw(a);
  a->mma = !a->f32 && tsr_mma_attn_fits(a);
  const int64_t rows = a->mma ? tsr_mma_rows(a) : TSR_TILE_WARPS * a->qpw;
  const int64_t units = (a->Nq * a->group + rows - 1) / rows * (a->Hq / a->group);
  const int64_t want = 2 * (int64_t)(n_sm > 0 ? n_sm : 132);
  int64_t splits = (want + units - 1) / units;
  const int64_t fewest = a->split_keys > 0 ? a->split_keys : TSR_TILE_MIN_KEYS_PER_SPLIT;
  const int64_t most = (a->Nkv + fewest - 1) / fewest;
  if (splits > most) splits = most;
  if (a->max_splits > 0 && splits > a->max_splits) splits = a->max_splits;
  if (splits < 1) splits = 1;
  a->per_split = (a->Nkv + splits - 1) / splits;
  if (a->per_split < 1) a->per_split = 1;
  a->splits = (int32_t)((a->Nkv + a->per_split - 1) / a->per_split);
  if (a->splits < 1) a->splits = 1;
  return a->splits > 1 ? sizeof(float) * (size_t)(a->Nq * a->Hq) * (size_t)a->splits *
                             (size_t)(a->Dv + 2 + (a->skip_below > 0.0f))
                       : 0;
}

template <class B, int VREG, int QPW>
static inline cudaError_t tsr_tile_attn_run(const struct tsr_tile_args *a, const B &policy,
                                            cudaStream_t stream) {
  return tsr_attn_run<tsr_tile_attn<B, VREG, QPW>>(a, policy, TSR_TILE_WARPS * QPW,
                                                   tsr_tile_smem(a, B::n), stream);
}

/* Launches a planned kernel (tsr_tile_attn_plan; a->part set when it asked for
** scratch) with the band policy `policy`. An error (head dims past 512, shared memory
** the device does not grant) launches nothing, and the caller keeps its own kernel. */
template <class B>
static inline cudaError_t tsr_tile_attn_launch(const struct tsr_tile_args *a, const B &policy,
                                               cudaStream_t stream) {
  static_assert(B::n >= 1 && B::n <= TSR_TILE_MAX_BANDS, "a band policy has 1 to 3 bands");
  if (a->D > TSR_TILE_MAX_D || a->Dv > TSR_TILE_MAX_D || a->Nq <= 0 || a->group <= 0 ||
      a->Hq % a->group || (a->splits > 1 && !a->part))
    return cudaErrorInvalidValue;
  if (!a->f32 && tsr_gqa_decode_fits(a)) return tsr_gqa_decode_launch(a, policy, stream);
  if (a->skip_below > 0.0f) return cudaErrorNotSupported; /* V skipping is that kernel's */
  if (a->mma) return tsr_mma_attn_launch(a, policy, stream);
  const int64_t d = a->D > a->Dv ? a->D : a->Dv;
  if (a->qpw == 2) {
    if (d <= 128) return tsr_tile_attn_run<B, 4, 2>(a, policy, stream);
    if (d <= 256) return tsr_tile_attn_run<B, 8, 2>(a, policy, stream);
    return tsr_tile_attn_run<B, 16, 2>(a, policy, stream);
  }
  if (d <= 128) return tsr_tile_attn_run<B, 4, 8>(a, policy, stream);
  if (d <= 256) return tsr_tile_attn_run<B, 8, 8>(a, policy, stream);
  return tsr_tile_attn_run<B, 16, 4>(a, policy, stream);
}

#endif
