/*
** Matrix-product kernels of the CUDA backend. The host half
** (cuda_matmul.c) picks between them:
**   - few columns (decode, n <= CU_GEMV_MAX_N), other types: cu_gemv, a warp per weight
**     row (block types: per two rows, a lane per 8 weights), dequantizing as
**     it reads and dotting in f32 against f32 x;
**   - by default (TESSERA_CUDA_GEMV=f32 turns it off), for q4_0, q8_0, q4_K and q6_K:
**     one column (and expert products of few pairs): cu_gemv_x8, x coded to 8 bits per
**     32 values once per product, a lane per 32-weight chunk, integer dots (dp4a);
**     CU_MMQ_MIN_N to CU_MMQ_MAX_N columns, and expert products grouped by expert on the
**     device: cu_mmq / cu_mmq_id, integer mma on x coded the same way (mmq.cuh);
**   - more columns: weights dequantized into f16 tiles (cu_dequant_rows) and
**     x packed to f16 (cu_pack_x), multiplied by cuBLAS with f32 accumulation.
** The weight type is a template parameter (one instantiation per type), the
** column count is 1 or up to CU_GEMV_MAX_N: that keeps the build small.
*/
#include <cuda_runtime.h>

#include "cuda_kernels.h"
#include "cuda_launch.cuh"
#include "mmq.cuh"
#include "tessera/cuda_quant.cuh"

#define WARPS 8 /* rows per gemv block */

/* Calls F<T>(args) for the weight type t; unknown types return an error. */
#define DISPATCH_TYPE(t, CALL)               \
  switch (t) {                               \
  case T_F32: CALL(T_F32); break;            \
  case T_F16: CALL(T_F16); break;            \
  case T_BF16: CALL(T_BF16); break;          \
  case T_Q4_0: CALL(T_Q4_0); break;          \
  case T_Q4_1: CALL(T_Q4_1); break;          \
  case T_Q5_0: CALL(T_Q5_0); break;          \
  case T_Q5_1: CALL(T_Q5_1); break;          \
  case T_Q8_0: CALL(T_Q8_0); break;          \
  case T_Q6_0: CALL(T_Q6_0); break;          \
  case T_Q2_K: CALL(T_Q2_K); break;          \
  case T_Q3_K: CALL(T_Q3_K); break;          \
  case T_Q4_K: CALL(T_Q4_K); break;          \
  case T_Q5_K: CALL(T_Q5_K); break;          \
  case T_Q6_K: CALL(T_Q6_K); break;          \
  case T_Q8_K: CALL(T_Q8_K); break;          \
  default: return (int)cudaErrorInvalidValue; \
  }

/* ---- dequantized tiles and packed x -------------------------------------------- */

/* Whether q4_K rows allow its 4-byte loads. */
static int chunk_wide(const char *w, int64_t wnb1) {
  return (uintptr_t)w % 4 == 0 && wnb1 % 4 == 0;
}

/* Plain weights (gemm_f32 mode): an element a thread. */
template <int T>
__global__ void k_dequant_rows(void *out, int half, const char *w, int64_t K, int64_t rows,
                               int64_t wnb1) {
  FOR_EACH(f, K * rows) {
    const int64_t r = f / K, k = f % K;
    const float v = dq<T>(reinterpret_cast<const uint8_t *>(w + r * wnb1), k);
    if (half) reinterpret_cast<__half *>(out)[f] = __float2half_rn(v);
    else reinterpret_cast<float *>(out)[f] = v;
  }
}

/* Block types: 8 consecutive weights a thread (dq_part8, the gemv's decoder, checked
** on the host), one 16-byte store of halves (two of floats), one division per 8
** weights instead of per weight. K is whole blocks, so a multiple of 32. */
template <int T>
__global__ void k_dequant_rows8(void *out, int half, const char *w, int64_t K, int64_t rows,
                                int64_t wnb1, int wide) {
  const int64_t per_row = K / 8;
  FOR_EACH(f, per_row * rows) {
    const int64_t r = f / per_row, c8 = f % per_row;
    float v[8];
    dq_part8<T>(reinterpret_cast<const uint8_t *>(w + r * wnb1), c8 / 4, (int)(c8 % 4), v, wide);
    if (half) {
      uint4 h;
      h.x = cu_half2_bits(v[0], v[1]), h.y = cu_half2_bits(v[2], v[3]);
      h.z = cu_half2_bits(v[4], v[5]), h.w = cu_half2_bits(v[6], v[7]);
      reinterpret_cast<uint4 *>(out)[f] = h;
    } else {
      float4 *o = reinterpret_cast<float4 *>(out) + 2 * f;
      o[0] = make_float4(v[0], v[1], v[2], v[3]);
      o[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
  }
}

extern "C" int cu_dequant_rows(cu_stream s, void *out, int half, const char *w, int32_t type,
                               int64_t K, int64_t rows, int64_t wnb1) {
  const bool plain = type == T_F32 || type == T_F16 || type == T_BF16;
  if (!plain && (K % 32 || (uintptr_t)out % 16)) return (int)cudaErrorInvalidValue;
  const int wide = chunk_wide(w, wnb1);
#define CALL(T)                                                                             \
  if (plain)                                                                                \
    k_dequant_rows<T><<<grid_for(K * rows), NT, 0, s>>>(out, half, w, K, rows, wnb1);       \
  else                                                                                      \
    k_dequant_rows8<T><<<grid_for(K / 8 * rows), NT, 0, s>>>(out, half, w, K, rows, wnb1, wide)
  DISPATCH_TYPE(type, CALL)
#undef CALL
  return (int)cudaGetLastError();
}

__global__ void k_pack_x(void *out, int to, const char *x, int64_t nb0, int64_t nb1, int64_t K,
                         int64_t N) {
  FOR_EACH(f, K * N) {
    const float v = *reinterpret_cast<const float *>(x + (f % K) * nb0 + (f / K) * nb1);
    if (to == 0) reinterpret_cast<float *>(out)[f] = v;
    else if (to == 1) reinterpret_cast<__half *>(out)[f] = __float2half_rn(fminf(fmaxf(v, -65504.0f), 65504.0f));
    else reinterpret_cast<uint16_t *>(out)[f] = f_bf16(v);
  }
}

extern "C" int cu_pack_x(cu_stream s, void *out, int to, const char *x, int64_t nb0, int64_t nb1,
                         int64_t K, int64_t N) {
  k_pack_x<<<grid_for(K * N), NT, 0, s>>>(out, to, x, nb0, nb1, K, N);
  return (int)cudaGetLastError();
}

/* ---- gemv: a warp per weight row, NMAX columns at most --------------------------- */

/* Block types: a lane decodes 8 consecutive weights, a quarter of a 32-weight
** chunk, so a warp step covers 256 consecutive weights and the x values its lanes
** read are contiguous. (A lane per whole chunk, as before, read x with a 128-byte
** stride between lanes: each of its x loads touched 32 cache lines, and x, 7x the
** bytes of a q4_0 row, bound the kernel at 10-18% of the copy rate.) q4_0, q8_0,
** q4_K and q6_K have their own decoders; the rest, and q4_K rows not aligned to 4
** bytes (a view), decode through dq: dq_part8 in tessera/cuda_quant.cuh, checked
** on the host. Plain types stay a lane per weight (64 contiguous bytes per warp
** step for f16: 62-65% of the copy rate). */


/* Rows a warp does for block types: they share the warp's x loads. */
#define GEMV_ROWS 2

/* Plain types: a warp per row, a lane per weight (a warp step reads 32 consecutive
** weights); block types: a warp per GEMV_ROWS rows, a lane per 8 weights (dq_part8). */
template <int T, int NMAX>
__global__ void k_gemv(float *y, int64_t ldy, const char *w, int64_t K, int64_t M, int64_t wnb1,
                       const float *x, int64_t ldx, int N, int x_vec, int wide) {
  constexpr bool plain = T == T_F32 || T == T_F16 || T == T_BF16;
  constexpr int R = plain ? 1 : GEMV_ROWS;
  const int64_t m0 = (blockIdx.x * (int64_t)WARPS + threadIdx.x / 32) * R;
  const int lane = threadIdx.x % 32;
  if (m0 >= M) return;
  float acc[R][NMAX];
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int n = 0; n < NMAX; n++) acc[r][n] = 0.0f;
  if constexpr (plain) {
    const uint8_t *row = reinterpret_cast<const uint8_t *>(w + m0 * wnb1);
    for (int64_t k = lane; k < K; k += 32) {
      const float v = dq<T>(row, k);
#pragma unroll
      for (int n = 0; n < NMAX; n++)
        if (n < N) acc[0][n] += v * x[k + n * ldx];
    }
  } else {
    const int p = lane % 4;
    for (int64_t c = lane / 4; c < K / 32; c += 8) {
      float wv[R][8];
#pragma unroll
      for (int r = 0; r < R; r++) {
        if (m0 + r < M)
          dq_part8<T>(reinterpret_cast<const uint8_t *>(w + (m0 + r) * wnb1), c, p, wv[r], wide);
        else
#pragma unroll
          for (int e = 0; e < 8; e++) wv[r][e] = 0.0f;
      }
#pragma unroll
      for (int n = 0; n < NMAX; n++) {
        if (n >= N) break;
        const float *xc = x + n * ldx + c * 32 + 8 * p;
        float xv[8];
        if (x_vec) {
          const float4 a = __ldg(reinterpret_cast<const float4 *>(xc));
          const float4 b = __ldg(reinterpret_cast<const float4 *>(xc) + 1);
          xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w;
          xv[4] = b.x, xv[5] = b.y, xv[6] = b.z, xv[7] = b.w;
        } else {
#pragma unroll
          for (int e = 0; e < 8; e++) xv[e] = __ldg(xc + e);
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
          float a = acc[r][n];
#pragma unroll
          for (int e = 0; e < 8; e++) a += wv[r][e] * xv[e];
          acc[r][n] = a;
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int n = 0; n < NMAX; n++) {
      float a = acc[r][n];
      for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
      if (lane == 0 && n < N && m0 + r < M) y[m0 + r + n * ldy] = a;
    }
}

extern "C" int cu_gemv(cu_stream s, float *y, int64_t ldy, const char *w, int32_t type, int64_t K,
                       int64_t M, int64_t wnb1, const float *x, int64_t ldx, int64_t N) {
  if (N < 1 || N > CU_GEMV_MAX_N) return (int)cudaErrorInvalidValue;
  const bool plain = type == T_F32 || type == T_F16 || type == T_BF16;
  if (!plain && K % 32) return (int)cudaErrorInvalidValue; /* block rows are whole blocks */
  const int64_t per_block = WARPS * (plain ? 1 : GEMV_ROWS);
  const unsigned blocks = (unsigned)((M + per_block - 1) / per_block);
  const int x_vec = (uintptr_t)x % 16 == 0 && ldx % 4 == 0, wide = chunk_wide(w, wnb1);
#define CALL(T)                                                                              \
  if (N == 1)                                                                                \
    k_gemv<T, 1><<<blocks, 32 * WARPS, 0, s>>>(y, ldy, w, K, M, wnb1, x, ldx, 1, x_vec, wide); \
  else                                                                                       \
    k_gemv<T, CU_GEMV_MAX_N><<<blocks, 32 * WARPS, 0, s>>>(y, ldy, w, K, M, wnb1, x, ldx,    \
                                                           (int)N, x_vec, wide)
  DISPATCH_TYPE(type, CALL)
#undef CALL
  return (int)cudaGetLastError();
}

/* The expert id of slot u of token t (mat_mul_id's ids [slots, tokens], i32). */
__device__ static inline int32_t expert_id(const cu_t &ids, int64_t u, int64_t t) {
  return *reinterpret_cast<const int32_t *>(ids.p + u * ids.nb[0] + t * ids.nb[1]);
}

/* ---- gemv, q8 path: x quantized to 8 bits, integer dots ----------------------- */

/* Why: the f32 gemv reads 4 bytes of x from L1 per weight against 0.56 bytes of a
** q4_0 weight from HBM, and a lane's 4 bytes of weights per step leave too few
** bytes in flight to cover HBM's latency. Here x is coded once per product
** (x8_block's rule, a warp per 32 values) and a lane takes a whole 32-weight chunk:
** 18-34 bytes of weights per row and 32 bytes of x codes, dotted four bytes at a time. */
/* A warp's 32 values (v this lane's) coded by x8_block's rule: this lane's code; *d the
** scale and *sum the codes' sum, on every lane. */
__device__ static inline int x8_code_warp(float v, float *d, int *sum) {
  float amax = fabsf(v);
  for (int o = 16; o > 0; o >>= 1) amax = x8_absmax(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  *d = x8_scale(amax);
  const int q = x8_code(v, x8_inv(*d));
  int s = q;
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  *sum = s;
  return q;
}

__global__ void k_quant_x8(int8_t *xq, float2 *xds, const float *x, int64_t ldx, int64_t K, int N) {
  const int64_t nc = K / 32, blk = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (blk >= nc * N) return;
  const int64_t n = blk / nc, c = blk % nc;
  float d;
  int sum;
  const int q = x8_code_warp(x[n * ldx + c * 32 + lane], &d, &sum);
  xq[n * K + c * 32 + lane] = (int8_t)q;
  if (lane == 0) xds[n * nc + c] = make_float2(d, (float)sum);
}

/* Calls CALL(T) for the weight types the q8 path takes (x8_supported); others: an error. */
#define DISPATCH_X8(t, CALL)                  \
  switch (t) {                                \
  case T_Q4_0: CALL(T_Q4_0); break;           \
  case T_Q8_0: CALL(T_Q8_0); break;           \
  case T_Q4_K: CALL(T_Q4_K); break;           \
  case T_Q6_K: CALL(T_Q6_K); break;           \
  default: return (int)cudaErrorInvalidValue; \
  }

#define X8_WARPS 4 /* warps of a block */
#define X8_ROWS 2  /* rows of a warp group: they share the x loads */

/* Warps that split one row's chunks: as many as the row has 32-chunk steps, up to all
** four (a 4096-wide row fills four; an expert's 704-wide one, 22 chunks, one), so lanes
** are not left idle on short rows; the other warps take further rows. */
static int x8_warps_per_row(int64_t K) {
  const int64_t nc = K / 32;
  return nc > 64 ? 4 : nc > 32 ? 2 : 1;
}

/* Rows of a block: X8_ROWS for each group of wpr warps. */
__host__ __device__ static inline int64_t x8_rows_per_block(int wpr) {
  return (int64_t)(X8_WARPS / wpr) * X8_ROWS;
}

/* The block's rows m0 .. m0 + rows_per_block (at most M), each group of wpr warps
** X8_ROWS of them, dotted with N coded columns of x; the sums land in sum[row][n],
** shared, once the function returns (it ends on a barrier). */
template <int T, int NMAX>
__device__ static inline void x8_block_rows(float (*sum)[NMAX], const char *w, int64_t wnb1,
                                            int64_t M, int64_t m0, int wpr, int64_t K,
                                            const int8_t *xq, const float2 *xds, int N) {
  __shared__ float part[X8_WARPS][X8_ROWS][NMAX];
  const int64_t nc = K / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, sub = warp % wpr;
  const int64_t g0 = m0 + (int64_t)(warp / wpr) * X8_ROWS; /* this warp group's rows */
  float acc[X8_ROWS][NMAX];
#pragma unroll
  for (int r = 0; r < X8_ROWS; r++)
#pragma unroll
    for (int n = 0; n < NMAX; n++) acc[r][n] = 0.0f;
#pragma unroll 2
  for (int64_t c = sub * 32 + lane; c < nc; c += 32 * wpr) {
    struct x8_chunk wc[X8_ROWS];
#pragma unroll
    for (int r = 0; r < X8_ROWS; r++)
      if (g0 + r < M) x8_decode<T>(reinterpret_cast<const uint8_t *>(w + (g0 + r) * wnb1), c, &wc[r]);
#pragma unroll
    for (int n = 0; n < NMAX; n++) {
      if (n >= N) break;
      const int4 *xp = reinterpret_cast<const int4 *>(xq + n * K + c * 32);
      const int4 a = __ldg(xp), b = __ldg(xp + 1);
      const int xw[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      const float2 ds = __ldg(xds + n * nc + c);
#pragma unroll
      for (int r = 0; r < X8_ROWS; r++)
        if (g0 + r < M) acc[r][n] += x8_dot<T>(&wc[r], xw, ds.x, (int)ds.y);
    }
  }
#pragma unroll
  for (int r = 0; r < X8_ROWS; r++)
#pragma unroll
    for (int n = 0; n < NMAX; n++) {
      float a = acc[r][n];
      for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
      if (lane == 0) part[warp][r][n] = a;
    }
  __syncthreads();
  /* row i of the block: group i / X8_ROWS, its warps summed */
  for (int i = threadIdx.x; i < X8_WARPS / wpr * X8_ROWS * NMAX; i += blockDim.x) {
    const int row = i / NMAX, n = i % NMAX, grp = row / X8_ROWS;
    float t = 0.0f;
    for (int k = 0; k < wpr; k++) t += part[grp * wpr + k][row % X8_ROWS][n];
    sum[row][n] = t;
  }
  __syncthreads();
}

template <int T, int NMAX>
__global__ void k_gemv_x8(float *y, int64_t ldy, const char *w, int64_t K, int64_t M,
                          int64_t wnb1, const int8_t *xq, const float2 *xds, int N, int wpr) {
  __shared__ float sum[X8_WARPS * X8_ROWS][NMAX];
  const int64_t rows = x8_rows_per_block(wpr), m0 = blockIdx.x * rows;
  x8_block_rows<T, NMAX>(sum, w, wnb1, M, m0, wpr, K, xq, xds, N);
  for (int i = threadIdx.x; i < rows * NMAX; i += blockDim.x) {
    const int r = i / NMAX, n = i % NMAX;
    if (n < N && m0 + r < M) y[m0 + r + n * ldy] = sum[r][n];
  }
}

/* mat_mul_id, few pairs: blockIdx.y is the pair (slot u, token t), whose expert id the
** block reads on the device; x's coded columns are [K, xs1, T] packed (xs1 1: shared
** by the slots). An id outside [0, E) writes zeros, as on the CPU. */
template <int T>
__global__ void k_gemv_x8_id(cu_t dst, cu_t w, cu_t ids, const int8_t *xq, const float2 *xds,
                             int64_t xs1, int wpr) {
  __shared__ float sum[X8_WARPS * X8_ROWS][1];
  const int64_t K = w.ne[0], M = w.ne[1], nu = ids.ne[0], p = blockIdx.y, u = p % nu, t = p / nu;
  const int64_t rows = x8_rows_per_block(wpr), m0 = blockIdx.x * rows;
  const int64_t col = t * xs1 + (xs1 == 1 ? 0 : u);
  const int32_t e = expert_id(ids, u, t);
  const bool valid = e >= 0 && e < w.ne[2];
  if (valid) /* uniform over the block: the barriers inside are safe */
    x8_block_rows<T, 1>(sum, w.p + e * w.nb[2], w.nb[1], M, m0, wpr, K, xq + col * K,
                        xds + col * (K / 32), 1);
  for (int r = threadIdx.x; r < rows; r += blockDim.x)
    if (m0 + r < M)
      *reinterpret_cast<float *>(dst.p + (m0 + r) * dst.nb[0] + u * dst.nb[1] + t * dst.nb[2]) =
          valid ? sum[r][0] : 0.0f;
}

/* x (f32, columns ldx apart) coded into scratch: codes, then (scale, sum) per chunk. */
static void code_x(cu_stream s, void *scratch, const float *x, int64_t ldx, int64_t K, int64_t N,
                    int8_t **xq, float2 **xds) {
  *xq = static_cast<int8_t *>(scratch);
  *xds = reinterpret_cast<float2 *>(*xq + (K * N + 15) / 16 * 16);
  const int64_t warps = K / 32 * N;
  k_quant_x8<<<(unsigned)((warps + 7) / 8), 256, 0, s>>>(*xq, *xds, x, ldx, K, (int)N);
}

extern "C" int cu_gemv_x8_supports(int32_t type, int64_t K) {
  return x8_supported(type) && K >= 32 && K % 32 == 0;
}

extern "C" size_t cu_gemv_x8_scratch(int64_t K, int64_t N) {
  return (size_t)(K * N + 15) / 16 * 16 + (size_t)(K / 32 * N) * sizeof(float2);
}

extern "C" int cu_gemv_x8(cu_stream s, void *scratch, float *y, int64_t ldy, const char *w,
                          int32_t type, int64_t K, int64_t M, int64_t wnb1, const float *x,
                          int64_t ldx, int64_t N) {
  if (N < 1 || N > CU_GEMV_MAX_N || !cu_gemv_x8_supports(type, K) || (uintptr_t)scratch % 16)
    return (int)cudaErrorInvalidValue;
  int8_t *xq;
  float2 *xds;
  code_x(s, scratch, x, ldx, K, N, &xq, &xds);
  const int wpr = x8_warps_per_row(K);
  const int64_t rows = x8_rows_per_block(wpr);
  const unsigned blocks = (unsigned)((M + rows - 1) / rows);
#define CALL(T)                                                                                \
  if (N == 1)                                                                                  \
    k_gemv_x8<T, 1><<<blocks, 32 * X8_WARPS, 0, s>>>(y, ldy, w, K, M, wnb1, xq, xds, 1, wpr);  \
  else                                                                                         \
    k_gemv_x8<T, CU_GEMV_MAX_N><<<blocks, 32 * X8_WARPS, 0, s>>>(y, ldy, w, K, M, wnb1, xq,    \
                                                                 xds, (int)N, wpr)
  DISPATCH_X8(type, CALL)
#undef CALL
  return (int)cudaGetLastError();
}

extern "C" int cu_mat_mul_id_x8(cu_stream s, void *scratch, const cu_t *dst, const cu_t *w,
                                const cu_t *x, const cu_t *ids) {
  const int64_t K = w->ne[0], M = w->ne[1], np = ids->ne[0] * ids->ne[1];
  const int64_t cols = x->ne[1] * x->ne[2];
  if (!cu_gemv_x8_supports(w->type, K) || x->nb[0] != 4 || x->nb[2] != x->nb[1] * x->ne[1] ||
      x->nb[1] % 4 || (uintptr_t)scratch % 16 || np < 1)
    return (int)cudaErrorInvalidValue;
  int8_t *xq;
  float2 *xds;
  code_x(s, scratch, reinterpret_cast<const float *>(x->p), x->nb[1] / 4, K, cols, &xq, &xds);
  const int wpr = x8_warps_per_row(K);
  const int64_t rows = x8_rows_per_block(wpr);
  const dim3 grid((unsigned)((M + rows - 1) / rows), (unsigned)np);
#define CALL(T) \
  k_gemv_x8_id<T><<<grid, 32 * X8_WARPS, 0, s>>>(*dst, *w, *ids, xq, xds, x->ne[1], wpr)
  DISPATCH_X8(w->type, CALL)
#undef CALL
  return (int)cudaGetLastError();
}

/* ---- mat_mul_id ----------------------------------------------------------------- */

/* A warp per (row, pair): the expert id is read on the device, so nothing
** waits for the host. An id outside [0, E) writes 0, as on the CPU. */
__global__ void k_mmid_direct(cu_t dst, cu_t w, cu_t x, cu_t ids) {
  const int64_t M = w.ne[1], nu = ids.ne[0], np = nu * ids.ne[1];
  const int64_t item = blockIdx.x * (int64_t)WARPS + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (item >= M * np) return;
  const int64_t m = item % M, p = item / M, u = p % nu, t = p / nu;
  const int32_t e = expert_id(ids, u, t);
  float acc = 0.0f;
  if (e >= 0 && e < w.ne[2]) {
    const char *row = w.p + e * w.nb[2] + m * w.nb[1];
    const char *col = x.p + (x.ne[1] == 1 ? 0 : u) * x.nb[1] + t * x.nb[2];
    for (int64_t k = lane; k < w.ne[0]; k += 32)
      acc += dq_rt(w.type, row, k, w.nb[0]) * *reinterpret_cast<const float *>(col + k * x.nb[0]);
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  }
  if (lane == 0)
    *reinterpret_cast<float *>(dst.p + m * dst.nb[0] + u * dst.nb[1] + t * dst.nb[2]) = acc;
}

extern "C" int cu_mat_mul_id_direct(cu_stream s, const cu_t *dst, const cu_t *w, const cu_t *x,
                                    const cu_t *ids) {
  const int64_t items = w->ne[1] * ids->ne[0] * ids->ne[1];
  k_mmid_direct<<<(unsigned)((items + WARPS - 1) / WARPS), 32 * WARPS, 0, s>>>(*dst, *w, *x, *ids);
  return (int)cudaGetLastError();
}

__global__ void k_gather_pairs(float *out, cu_t x, const int32_t *list, int64_t n, int64_t nu) {
  const int64_t K = x.ne[0];
  FOR_EACH(f, K * n) {
    const int64_t k = f % K, p = list[f / K], u = p % nu, t = p / nu;
    out[f] = *reinterpret_cast<const float *>(x.p + k * x.nb[0] + (x.ne[1] == 1 ? 0 : u) * x.nb[1] +
                                              t * x.nb[2]);
  }
}

extern "C" int cu_gather_pairs(cu_stream s, float *out, const cu_t *x, const int32_t *list,
                               int64_t n, int64_t nu) {
  k_gather_pairs<<<grid_for(x->ne[0] * n), NT, 0, s>>>(out, *x, list, n, nu);
  return (int)cudaGetLastError();
}

__global__ void k_scatter_pairs(cu_t dst, const float *y, const int32_t *list, int64_t n,
                                int64_t nu) {
  const int64_t M = dst.ne[0];
  FOR_EACH(f, M * n) {
    const int64_t m = f % M, p = list[f / M], u = p % nu, t = p / nu;
    *reinterpret_cast<float *>(dst.p + m * dst.nb[0] + u * dst.nb[1] + t * dst.nb[2]) = y[f];
  }
}

extern "C" int cu_scatter_pairs(cu_stream s, const cu_t *dst, const float *y, const int32_t *list,
                                int64_t n, int64_t nu) {
  k_scatter_pairs<<<grid_for(dst->ne[0] * n), NT, 0, s>>>(*dst, y, list, n, nu);
  return (int)cudaGetLastError();
}

/* ---- integer tensor-core products (mmq.cuh) ------------------------------------- */

/* Coded column k of x for the mmq kernels (mmq_code_at's layout; k < ncols, the rest of
** the padded columns zeros): x column k (list NULL), or the column of pair list[k] (slot p %
** nu, token p / nu: x column token xs1 + (xs1 == 1 ? 0 : slot)), zeros where list[k] < 0.
** A warp per (column, chunk), as k_quant_x8. */
__global__ void k_quant_x8_mmq(int8_t *xq, float2 *xds, int64_t ldc, const float *x, int64_t ldx,
                               int64_t K, int64_t ncols, int64_t padded, const int32_t *list,
                               int64_t nu, int64_t xs1) {
  const int64_t nc = K / 32, blk = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (blk >= nc * padded) return;
  const int64_t k = blk / nc, c = blk % nc;
  int64_t col = k < ncols ? k : -1;
  if (list && col >= 0) {
    const int64_t p = list[k];
    col = p < 0 ? -1 : p / nu * xs1 + (xs1 == 1 ? 0 : p % nu);
  }
  float d;
  int sum;
  const int q = x8_code_warp(col >= 0 ? x[col * ldx + c * 32 + lane] : 0.0f, &d, &sum);
  xq[(k * nc + c) * 32 + mmq_code_at(lane)] = (int8_t)q;
  if (lane == 0) xds[c * ldc + k] = make_float2(d, (float)sum);
}

/* Where a block's columns go. Dense: coded columns n0 + j, y[m + (n0 + j) ldy]. Grouped
** (tiles set): tile blockIdx.y = {expert, first coded column, count}; coded column k holds
** pair list[k] (slot p % nu, token p / nu), whose output starts at dp + slot dnb1 + token
** dnb2. */
struct mmq_io {
  float *y;
  int64_t ldy, N;
  const int4 *tiles;
  const int32_t *list;
  int64_t nu;
  char *dp;
  int64_t dnb0, dnb1, dnb2;
};

__device__ static inline void mma_k32(int c[4], int a0, int a1, int a2, int a3, int b0, int b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ static inline void mma_k16(int c[4], int a0, int a1, int b0) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(b0));
}

#define MMQ_WARPS 8                     /* warps of a block, MMQ_ROWS rows each */
#define MMQ_BLOCK_ROWS (MMQ_WARPS * MMQ_ROWS) /* rows of a block */

/* Chunks a block stages a step (a k-quant's superblock; 4 of the 32-weight types, whose
** step then takes as many bytes), their bytes in a row, and the staged tile's row stride: room
** for the 16-byte windows covering a span at any offset, an odd number of 16-byte units so
** the 8 rows a fragment reads start in 8 different banks. */
template <int T> __host__ __device__ constexpr int mmq_step() { return T == T_Q4_K || T == T_Q6_K ? 8 : 4; }
template <int T> __host__ __device__ constexpr int mmq_span() {
  return T == T_Q4_K || T == T_Q6_K ? cu_block_bytes(T) : cu_block_bytes(T) * mmq_step<T>();
}
template <int T> __host__ __device__ constexpr int mmq_stride() {
  return ((mmq_span<T>() + 15 + 15) / 16 | 1) * 16;
}
template <int T> __device__ static inline int64_t mmq_offset(int64_t c) {
  return T == T_Q4_K || T == T_Q6_K ? c / 8 * cu_block_bytes(T) : c * cu_block_bytes(T);
}
/* Dynamic shared memory of one stage: the weight tile, x's codes [chunk][column][32], scales. */
template <int T> static size_t mmq_stage_bytes(int bn) {
  return (size_t)MMQ_BLOCK_ROWS * mmq_stride<T>() + (size_t)mmq_step<T>() * bn * 40;
}
template <int T> static size_t mmq_smem(int bn) { return 2 * mmq_stage_bytes<T>(bn); }

/* 16 bytes from global src to shared dst, of which the first `valid` are read and the rest
** zero-filled (cp.async's source size: a window never reads past a row's staged span). */
__device__ static inline void cp_async16(void *dst, const void *src, int valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                   (unsigned)__cvta_generic_to_shared(dst)),
               "l"(src), "r"(valid));
}
__device__ static inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ static inline void cp_async_wait_prior() { asm volatile("cp.async.wait_group 1;\n" ::); }

/* Where row m's span for the step at chunk c0 starts. What is staged is the 16-byte windows
** covering it (rows of a k-quant are 2-byte aligned at best): the span sits at its address
** mod 16 in the staged row. */
template <int T>
__device__ static inline const char *mmq_src(const char *w, int64_t wnb1, int64_t m, int64_t c0) {
  return w + m * wnb1 + mmq_offset<T>(c0);
}

/* A block: MMQ_BLOCK_ROWS rows from blockIdx.x, NTILE n tiles of columns (mmq_io), chunks
** [blockIdx.z csz, + csz) of K (split-K: gridDim.z > 1 writes partial sums to part[z][column][row]
** for k_mmq_reduce, dense only), x coded by k_quant_x8_mmq (scales ldc apart). The block
** stages mmq_step chunks at a time in shared memory with cp.async, two stages in flight: each
** row's bytes as the 16-byte windows covering them, x's codes and scales for the block's
** columns; then each warp multiplies its 16 rows' chunks against every column. A block of 128
** rows reads x once for all of them: blocks of 16 rows read x 8 times as often, more bytes
** than the weights (the kernel's first versions). */
template <int T, int NTILE>
__global__ void __launch_bounds__(32 * MMQ_WARPS, 2)
k_mmq(const char *w, int64_t wnb1, int64_t wnb2, int64_t K, int64_t M, int64_t csz,
      const int8_t *xq, const float2 *xds, int64_t ldc, struct mmq_io io, float *part) {
  constexpr int BN = NTILE * MMQ_COLS, STEP = mmq_step<T>(), SPAN = mmq_span<T>();
  constexpr int STRIDE = mmq_stride<T>(), UNITS = STRIDE / 16;
  constexpr int STAGE = MMQ_BLOCK_ROWS * STRIDE + STEP * BN * 40;
  extern __shared__ __align__(16) unsigned char s_dyn[];
  __shared__ char *s_out[BN]; /* where each column's row 0 goes */
  int n;
  int64_t k0; /* the block's first coded column */
  if (io.tiles) {
    const int4 tl = io.tiles[blockIdx.y];
    n = tl.z, k0 = tl.y;
    if (n == 0) return; /* an unused tile: uniform over the block, before any barrier */
    w += tl.x * wnb2;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      const int64_t p = io.list[k0 + j];
      s_out[j] = io.dp + p % io.nu * io.dnb1 + p / io.nu * io.dnb2;
    }
  } else {
    k0 = blockIdx.y * (int64_t)BN;
    n = (int)(io.N - k0 < BN ? io.N - k0 : BN);
    for (int j = threadIdx.x; j < n; j += blockDim.x)
      s_out[j] = part ? reinterpret_cast<char *>(part + ((int64_t)blockIdx.z * io.N + k0 + j) * M)
                      : reinterpret_cast<char *>(io.y + (k0 + j) * io.ldy);
  }
  const int cols = (n + MMQ_COLS - 1) / MMQ_COLS * MMQ_COLS; /* coded columns the block reads */
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t mb = blockIdx.x * (int64_t)MMQ_BLOCK_ROWS, m0 = mb + warp * MMQ_ROWS;
  /* the lane's two rows (past M: the last row again, never stored) */
  const int64_t ma = m0 + g < M ? m0 + g : M - 1, mc = m0 + g + 8 < M ? m0 + g + 8 : M - 1;
  const int64_t nc = K / 32, c_begin = blockIdx.z * csz;
  const int64_t c_end = c_begin + csz < nc ? c_begin + csz : nc;
  /* the step at c0 into stage `buf`: a short last step of q4_0 / q8_0 stages fewer bytes */
  auto stage = [&](int buf, int64_t c0) {
    unsigned char *s_w = s_dyn + buf * STAGE;
    int8_t *s_codes = reinterpret_cast<int8_t *>(s_w + MMQ_BLOCK_ROWS * STRIDE);
    float2 *s_ds = reinterpret_cast<float2 *>(s_codes + STEP * BN * 32);
    const int in_step = (int)(c_end - c0 < STEP ? c_end - c0 : STEP);
    const int span = T == T_Q4_0 || T == T_Q8_0 ? SPAN / STEP * in_step : SPAN;
    for (int v = threadIdx.x; v < MMQ_BLOCK_ROWS * UNITS; v += blockDim.x) {
      const int r = v / UNITS, q = v % UNITS;
      const int64_t m = mb + r < M ? mb + r : M - 1;
      const char *src = mmq_src<T>(w, wnb1, m, c0);
      const char *win = reinterpret_cast<const char *>((uintptr_t)src & ~(uintptr_t)15) + 16 * q;
      const int64_t valid = src + span - win;
      if (valid > 0) cp_async16(s_w + r * STRIDE + 16 * q, win, valid < 16 ? (int)valid : 16);
    }
    for (int v = threadIdx.x; v < cols * in_step * 2; v += blockDim.x) {
      const int j = v / (in_step * 2), h = v % (in_step * 2) / 2, half = v % 2;
      cp_async16(s_codes + (h * BN + j) * 32 + 16 * half,
                 xq + ((k0 + j) * nc + c0 + h) * 32 + 16 * half, 16);
    }
    for (int v = threadIdx.x; v < in_step * cols / 2; v += blockDim.x) {
      const int h = v / (cols / 2), j2 = v % (cols / 2);
      cp_async16(s_ds + h * BN + 2 * j2, xds + (c0 + h) * ldc + k0 + 2 * j2, 16);
    }
  };
  float acc[NTILE][4];
#pragma unroll
  for (int j = 0; j < NTILE; j++)
#pragma unroll
    for (int i = 0; i < 4; i++) acc[j][i] = 0.0f;
  stage(0, c_begin);
  cp_async_commit();
  int buf = 0;
  for (int64_t c0 = c_begin; c0 < c_end; c0 += STEP, buf ^= 1) {
    if (c0 + STEP < c_end) stage(buf ^ 1, c0 + STEP);
    cp_async_commit(); /* possibly empty: wait_prior then always means this step's group */
    cp_async_wait_prior();
    __syncthreads();
    const unsigned char *s_w = s_dyn + buf * STAGE;
    const int8_t *s_codes = reinterpret_cast<const int8_t *>(s_w + MMQ_BLOCK_ROWS * STRIDE);
    const float2 *s_ds = reinterpret_cast<const float2 *>(s_codes + STEP * BN * 32);
    const int ra = (int)((uintptr_t)mmq_src<T>(w, wnb1, ma, c0) & 15);
    const int rc = (int)((uintptr_t)mmq_src<T>(w, wnb1, mc, c0) & 15);
    const unsigned char *sa = s_w + (warp * MMQ_ROWS + g) * STRIDE + ra;
    const unsigned char *sb = s_w + (warp * MMQ_ROWS + g + 8) * STRIDE + rc;
    const int in_step = (int)(c_end - c0 < STEP ? c_end - c0 : STEP);
    for (int h = 0; h < in_step; h++) {
      struct mmq_part pa, pb;
      mmq_part_of<T>(sa, h, t, ra % 4 == 0, &pa);
      mmq_part_of<T>(sb, h, t, rc % 4 == 0, &pb);
#pragma unroll
      for (int j = 0; j < NTILE; j++) {
        if (j * MMQ_COLS >= n) break; /* uniform */
        const int2 b = reinterpret_cast<const int2 *>(s_codes + (h * BN + j * MMQ_COLS + g) * 32)[t];
        const float4 ds = *reinterpret_cast<const float4 *>(s_ds + h * BN + j * MMQ_COLS + 2 * t);
        int lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
        if (T == T_Q6_K) {
          mma_k16(lo, pa.lo, pb.lo, b.x);
          mma_k16(hi, pa.hi, pb.hi, b.y);
        } else {
          mma_k32(lo, pa.lo, pb.lo, pa.hi, pb.hi, b.x, b.y);
        }
        acc[j][0] += mmq_scaled<T>(&pa, lo[0], hi[0], ds.x, (int)ds.y);
        acc[j][1] += mmq_scaled<T>(&pa, lo[1], hi[1], ds.z, (int)ds.w);
        acc[j][2] += mmq_scaled<T>(&pb, lo[2], hi[2], ds.x, (int)ds.y);
        acc[j][3] += mmq_scaled<T>(&pb, lo[3], hi[3], ds.z, (int)ds.w);
      }
    }
    __syncthreads(); /* the stage is read before the next step's copies refill it */
  }
  const int64_t dnb0 = part ? 4 : io.dnb0;
#pragma unroll
  for (int j = 0; j < NTILE; j++)
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int col = j * MMQ_COLS + 2 * t + (i & 1);
      const int64_t m = m0 + g + 8 * (i >> 1);
      if (col < n && m < M) *reinterpret_cast<float *>(s_out[col] + m * dnb0) = acc[j][i];
    }
}

/* y[m + n ldy] = the split-K partial sums part[z][n][m], summed in z order. */
__global__ void k_mmq_reduce(float *y, int64_t ldy, const float *part, int64_t M, int64_t N, int ks) {
  FOR_EACH(f, M * N) {
    float a = 0.0f;
    for (int z = 0; z < ks; z++) a += part[z * M * N + f];
    y[f % M + f / M * ldy] = a;
  }
}

/* n tiles a block takes for about `cols` columns: 1, 2, 4 or 8 */
static int mmq_tiles_for(int64_t cols) {
  return cols <= 8 ? 1 : cols <= 16 ? 2 : cols <= 32 ? 4 : 8;
}

/* How a dense product of N columns cuts K over blocks: the fewest parts (1, 2, 4, 8) that
** make two blocks for every multiprocessor, each part (but the last) two steps at least and whole
** superblocks (csz chunks a part). Only products of few row blocks split, so the partial
** sums' scratch (parts x M x N floats) stays small. */
struct mmq_split {
  int64_t csz;
  int parts;
};
static struct mmq_split mmq_split_k(int64_t K, int64_t M, int64_t N, int n_sm) {
  const int64_t nc = K / 32, row_blocks = (M + MMQ_BLOCK_ROWS - 1) / MMQ_BLOCK_ROWS;
  const int64_t bn = mmq_tiles_for(N) * MMQ_COLS, blocks = row_blocks * ((N + bn - 1) / bn);
  int ks = 1;
  while (ks < 8 && blocks * ks < 2 * (int64_t)n_sm && nc / (2 * ks) >= 16) ks *= 2;
  struct mmq_split s;
  s.csz = ((nc + ks - 1) / ks + 7) / 8 * 8;
  if (s.csz < 8) s.csz = 8;
  s.parts = (int)((nc + s.csz - 1) / s.csz);
  return s;
}

/* Coded x's bytes for ncols columns (padded to whole n tiles): codes, then the scales. */
static int64_t mmq_ldc(int64_t ncols) { return (ncols + MMQ_COLS - 1) / MMQ_COLS * MMQ_COLS; }
static size_t mmq_x_bytes(int64_t K, int64_t ncols) {
  return (size_t)(mmq_ldc(ncols) * K) + (size_t)(K / 32 * mmq_ldc(ncols)) * sizeof(float2);
}

static void mmq_code_x(cu_stream s, void *scratch, const float *x, int64_t ldx, int64_t K,
                       int64_t ncols, const int32_t *list, int64_t nu, int64_t xs1, int8_t **xq,
                       float2 **xds) {
  const int64_t ldc = mmq_ldc(ncols), warps = K / 32 * ldc;
  *xq = static_cast<int8_t *>(scratch);
  *xds = reinterpret_cast<float2 *>(*xq + ldc * K); /* 16-byte aligned: K a multiple of 32 */
  k_quant_x8_mmq<<<(unsigned)((warps + 7) / 8), 256, 0, s>>>(*xq, *xds, ldc, x, ldx, K, ncols, ldc,
                                                            list, nu, xs1);
}

/* Launches k_mmq<T, ntiles>, its dynamic shared memory allowed once per instantiation. */
template <int T, int NTILE>
static int mmq_launch_t(cu_stream s, dim3 grid, const char *w, int64_t wnb1, int64_t wnb2,
                        int64_t K, int64_t M, int64_t csz, const int8_t *xq,
                        const float2 *xds, int64_t ldc, const struct mmq_io &io, float *part) {
  static bool allowed;
  const size_t smem = mmq_smem<T>(NTILE * MMQ_COLS);
  if (!allowed) {
    const cudaError_t e =
        cudaFuncSetAttribute(k_mmq<T, NTILE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return (int)e;
    allowed = true;
  }
  k_mmq<T, NTILE><<<grid, 32 * MMQ_WARPS, smem, s>>>(w, wnb1, wnb2, K, M, csz, xq, xds, ldc, io,
                                                    part);
  return (int)cudaGetLastError();
}

static int mmq_launch(cu_stream s, int32_t type, int ntiles, dim3 grid, const char *w,
                      int64_t wnb1, int64_t wnb2, int64_t K, int64_t M, int64_t csz,
                      const int8_t *xq, const float2 *xds, int64_t ldc, const struct mmq_io &io,
                      float *part) {
#define CALL_NT(T, NTILE) \
  return mmq_launch_t<T, NTILE>(s, grid, w, wnb1, wnb2, K, M, csz, xq, xds, ldc, io, part)
#define CALL(T)                        \
  switch (ntiles) {                    \
  case 1: CALL_NT(T, 1);               \
  case 2: CALL_NT(T, 2);               \
  case 4: CALL_NT(T, 4);               \
  default: CALL_NT(T, 8);              \
  }
  DISPATCH_X8(type, CALL)
#undef CALL
#undef CALL_NT
  return (int)cudaErrorInvalidValue;
}

/* Scratch: coded x, then (from this offset) the split-K partial sums (mmq_split_k). */
static size_t mmq_part_offset(int64_t K, int64_t N) { return (mmq_x_bytes(K, N) + 15) / 16 * 16; }

extern "C" size_t cu_mmq_scratch(int64_t K, int64_t M, int64_t N, int n_sm) {
  const struct mmq_split sk = mmq_split_k(K, M, N, n_sm);
  return mmq_part_offset(K, N) + (sk.parts > 1 ? (size_t)(sk.parts * M * N) * sizeof(float) : 0);
}

extern "C" int cu_mmq(cu_stream s, void *scratch, float *y, int64_t ldy, const char *w,
                      int32_t type, int64_t K, int64_t M, int64_t wnb1, const float *x,
                      int64_t ldx, int64_t N, int n_sm) {
  const int ntiles = mmq_tiles_for(N);
  const int64_t ycols = (N + ntiles * MMQ_COLS - 1) / (ntiles * MMQ_COLS);
  if (N < 1 || M < 1 || !cu_gemv_x8_supports(type, K) || (uintptr_t)scratch % 16 || ycols > 65535)
    return (int)cudaErrorInvalidValue;
  int8_t *xq;
  float2 *xds;
  mmq_code_x(s, scratch, x, ldx, K, N, NULL, 1, 1, &xq, &xds);
  const int64_t row_blocks = (M + MMQ_BLOCK_ROWS - 1) / MMQ_BLOCK_ROWS;
  const struct mmq_split sk = mmq_split_k(K, M, N, n_sm);
  float *part = sk.parts > 1
                    ? reinterpret_cast<float *>(static_cast<char *>(scratch) + mmq_part_offset(K, N))
                    : NULL;
  struct mmq_io io = {};
  io.y = y, io.ldy = ldy, io.N = N, io.dnb0 = 4;
  const dim3 grid((unsigned)row_blocks, (unsigned)ycols, (unsigned)sk.parts);
  const int e = mmq_launch(s, type, ntiles, grid, w, wnb1, 0, K, M, sk.csz, xq, xds, mmq_ldc(N),
                           io, part);
  if (e || !part) return e;
  k_mmq_reduce<<<grid_for(M * N), NT, 0, s>>>(y, ldy, part, M, N, sk.parts);
  return (int)cudaGetLastError();
}

/* ---- grouped expert products: pairs sorted by expert on the device ---------------- */

/* One block: counts each expert's pairs, lays them out expert by expert in list (within an
** expert in any order: a column's sums do not depend on where it sits), each expert's run
** starting at a multiple of MMQ_COLS (the gaps -1), cuts each run into tiles of at most bn
** columns ({expert, first, count, 0}; the rest of max_tiles get count 0), and zeroes the
** output columns of ids outside [0, E). Shared: 2 (E + 1) ints. */
__global__ void k_mmq_group(cu_t ids, int64_t E, int bn, int32_t *list, int64_t list_len,
                            int4 *tiles, int64_t max_tiles, cu_t dst) {
  extern __shared__ int s_cnt[]; /* [E + 1] counts, then cursors; [E + 1] starts */
  int *start = s_cnt + E + 1;
  const int64_t nu = ids.ne[0], np = nu * ids.ne[1];
  for (int64_t e = threadIdx.x; e <= E; e += blockDim.x) s_cnt[e] = 0;
  for (int64_t k = threadIdx.x; k < list_len; k += blockDim.x) list[k] = -1;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < np; p += blockDim.x) {
    const int32_t e = expert_id(ids, p % nu, p / nu);
    if (e >= 0 && e < E) atomicAdd(&s_cnt[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t k = 0;
    start[0] = 0;
    for (int64_t e = 0; e < E; e++) {
      for (int c = start[e]; c < start[e] + s_cnt[e] && k < max_tiles; c += bn, k++)
        tiles[k] = make_int4((int)e, c, start[e] + s_cnt[e] - c < bn ? start[e] + s_cnt[e] - c : bn, 0);
      start[e + 1] = start[e] + (s_cnt[e] + MMQ_COLS - 1) / MMQ_COLS * MMQ_COLS;
      s_cnt[e] = 0;
    }
    for (; k < max_tiles; k++) tiles[k] = make_int4(0, 0, 0, 0);
  }
  __syncthreads();
  for (int64_t p = threadIdx.x; p < np; p += blockDim.x) {
    const int64_t u = p % nu, tok = p / nu;
    const int32_t e = expert_id(ids, u, tok);
    if (e >= 0 && e < E) {
      list[start[e] + atomicAdd(&s_cnt[e], 1)] = (int32_t)p;
    } else {
      for (int64_t m = 0; m < dst.ne[0]; m++)
        *reinterpret_cast<float *>(dst.p + m * dst.nb[0] + u * dst.nb[1] + tok * dst.nb[2]) = 0.0f;
    }
  }
}

/* The grouped launch's layout: n tiles a block, tiles at most, coded columns at most (each
** active expert's run padded to whole n tiles of 8). */
static void mmq_id_shape(int64_t np, int64_t E, int *ntiles, int64_t *max_tiles, int64_t *cols) {
  const int64_t active = E < np ? E : np;
  *ntiles = mmq_tiles_for((np + active - 1) / active);
  const int64_t bn = *ntiles * MMQ_COLS;
  *max_tiles = (np + bn - 1) / bn + active;
  *cols = np + (MMQ_COLS - 1) * active;
}

extern "C" int cu_mmq_id_supports(int32_t type, int64_t K, int64_t E, int64_t np) {
  int ntiles;
  int64_t max_tiles, cols;
  if (!cu_gemv_x8_supports(type, K) || E < 1 || E > CU_MMQ_MAX_EXPERTS || np < 1) return 0;
  mmq_id_shape(np, E, &ntiles, &max_tiles, &cols);
  return max_tiles <= 65535 && cols < INT32_MAX;
}

/* Scratch: coded x, then list (cols ints), then tiles. */
extern "C" size_t cu_mmq_id_scratch(int64_t K, int64_t np, int64_t E) {
  int ntiles;
  int64_t max_tiles, cols;
  mmq_id_shape(np, E, &ntiles, &max_tiles, &cols);
  return mmq_x_bytes(K, cols) + (size_t)(cols + 3) / 4 * 16 + (size_t)max_tiles * 16;
}

extern "C" int cu_mmq_id(cu_stream s, void *scratch, const cu_t *dst, const cu_t *w, const cu_t *x,
                         const cu_t *ids) {
  const int64_t K = w->ne[0], M = w->ne[1], E = w->ne[2], np = ids->ne[0] * ids->ne[1];
  if (!cu_mmq_id_supports(w->type, K, E, np) || x->nb[0] != 4 || x->nb[1] % 4 ||
      (x->ne[2] > 1 && x->nb[2] % 4) || (uintptr_t)scratch % 16)
    return (int)cudaErrorInvalidValue;
  int ntiles;
  int64_t max_tiles, cols;
  mmq_id_shape(np, E, &ntiles, &max_tiles, &cols);
  char *after = static_cast<char *>(scratch) + mmq_x_bytes(K, cols);
  int32_t *list = reinterpret_cast<int32_t *>(after);
  int4 *tiles = reinterpret_cast<int4 *>(after + (cols + 3) / 4 * 16);
  k_mmq_group<<<1, 1024, (size_t)(2 * (E + 1)) * sizeof(int), s>>>(
      *ids, E, ntiles * MMQ_COLS, list, cols, tiles, max_tiles, *dst);
  /* x [K, xs1, T]: slot u of token t is column t xs1 + u (xs1 1: shared), its rows nb1 apart */
  if (x->ne[1] > 1 && x->nb[2] != x->nb[1] * x->ne[1]) return (int)cudaErrorInvalidValue;
  const int64_t ldx = x->ne[1] > 1 ? x->nb[1] / 4 : x->nb[2] / 4;
  int8_t *xq;
  float2 *xds;
  mmq_code_x(s, scratch, reinterpret_cast<const float *>(x->p), ldx, K, cols, list, ids->ne[0],
             x->ne[1], &xq, &xds);
  /* the tiles fill the device: K is not split */
  struct mmq_io io = {};
  io.tiles = tiles, io.list = list, io.nu = ids->ne[0];
  io.dp = dst->p, io.dnb0 = dst->nb[0], io.dnb1 = dst->nb[1], io.dnb2 = dst->nb[2];
  return mmq_launch(s, w->type, ntiles,
                    dim3((unsigned)((M + MMQ_BLOCK_ROWS - 1) / MMQ_BLOCK_ROWS), (unsigned)max_tiles, 1),
                    w->p, w->nb[1], w->nb[2], K, M, K / 32, xq, xds, mmq_ldc(cols), io, NULL);
}
