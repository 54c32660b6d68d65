/*
** The GQA decode kernel of the GPU: one query against one KV head's keys, the
** query's q heads of that head's group (up to 8) as the 8 columns of an mma
** fragment and the keys as its 16 rows, S^T = K Q^T and O^T += V^T P^T on
** mma.sync m16n8k16 (f16 operands, f32 sums). Opt-in until measured
** (tsr_tile_args.gqa_decode; TESSERA_CUDA_ATTN_GQA_DECODE=1, or 2 for the staged
** variant below).
**
** Why: the tile kernels decode with 16 rows a warp, of which a decode step's
** group fills at most 8, and stage every K/V tile through shared memory between
** block barriers. At head dim 512 with q8_0 K and q4_0 V that decode ran at 224
** GB/s, so the 1M-token step was 39.1 ms of attention in 39.6. Here every warp
** walks its own keys, 16 a step, with no barrier in the loop: it reads each K and
** V element once, from global memory straight into mma fragments (a pair of
** values a load, f16 caches as they are, q8_0 and q4_0 codes turned to f16 as
** tsr_dq_quarter_h does: the bits of dq's value rounded to f16), and turns the
** probabilities from S^T's fragment into P^T's by movmatrix. Staged (q8_0 and q4_0
** rows end to end), each warp copies its next step's K and V rows whole into shared
** memory by 16-byte cp.async while it computes the current step, so a step's every
** byte is in flight at once, and the fragments read their pairs there. The block's warps
** merge their softmax states at the end; splits merge as the tile kernels' do
** (tsr_tile_combine), from the same plan (tsr_tile_attn_plan).
**
** Semantics are the tile kernels': the band policy's band per key and gain
** (tessera/cuda_attn_tile.cuh), empty cells, causal, window, mask, softcap; a key
** that is not seen has its logit at -inf and its V values zeroed (a removed
** cell's bytes are never multiplied in); a row with no key gives zeros.
**
** Fragment layouts (PTX ISA, mma.m16n8k16 .f16): lane = 4 g + t; A (16x16,
** row-major) a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 2t+8..),
** a[3] = (g+8, 2t+8..); B (16x8) b0 = (2t..2t+1, g), b1 = (2t+8.., g); C (16x8)
** c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1). The sums of Q K^T may take the
** head dims in any order both operands agree on, and O's dims may sit in any row
** of the fragment the store knows: a 32-dim block's k steps and rows are chosen
** so that one load brings a pair of adjacent values (tsr_gqa_k_dim,
** tsr_gqa_v_dim). The helpers are host and device: core/cuda/tests/
** test_cuda_attn_gqa.cu runs them on the CPU through an emulated mma.
*/
#ifndef TESSERA_CUDA_ATTN_GQA_CUH
#define TESSERA_CUDA_ATTN_GQA_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#include "tessera/cuda_attn_args.cuh"
#include "tessera/cuda_quant.cuh"

/* Keys a warp takes a step (the fragment's rows). */
#define TSR_GQA_KEYS 16

/* Values e, e + 1 (e even, one block) of a row of type T as a half2's bits, (e, e + 1) in
** (low, high). The type is a template parameter: a branch on it between two pairs would
** make each pair's loads wait for the last one's use. The core reads f16, q8_0 and q4_0; a
** KV codec's read kernel (tessera/plugin/kv_codec.h) adds its own block layout by
** specializing tsr_gqa_reader for a type id of its own (>= TSR_GQA_CODEC_TYPES) before it
** instantiates the kernel. */
#define TSR_GQA_CODEC_TYPES 1000
template <int T> struct tsr_gqa_reader {
  static_assert(T == T_F16 || T == T_Q8_0 || T == T_Q4_0, "f16, q8_0, q4_0 or a codec's");
  CU_HD static inline uint32_t pair(const char *row, int64_t e) {
    if (T == T_F16) return *reinterpret_cast<const uint32_t *>(row + 2 * e);
    const int i = (int)(e % 32);
    const uint8_t *b = reinterpret_cast<const uint8_t *>(row) + e / 32 * (T == T_Q8_0 ? 34 : 18);
    uint32_t u;
    __half2 bias;
    if (T == T_Q8_0) { /* int8 codes, made 0..255 by flipping the sign bit */
      u = (uint32_t)*reinterpret_cast<const uint16_t *>(b + 2 + i) ^ 0x8080u;
      bias = __float2half2_rn(1024.0f + 128.0f);
    } else { /* q4_0: value i < 16 the low nibble of code byte i, i + 16 the high */
      u = (uint32_t)*reinterpret_cast<const uint16_t *>(b + 2 + (i & 15)) >> (i & 16 ? 4 : 0) &
          0x0f0fu;
      bias = __float2half2_rn(1024.0f + 8.0f);
    }
    return tsr_codes_to_h2(u, 0x5140, bias, __half2half2(*reinterpret_cast<const __half *>(b)));
  }
};

template <int T>
CU_HD static inline uint32_t tsr_gqa_pair(const char *row, int64_t e) {
  return tsr_gqa_reader<T>::pair(row, e);
}

/* The head dim that k step s (0, 1) of 32-dim block `blk` puts in column c (0..15) of A
** (K's row) and row c of B (Q^T's column): columns 2t, 2t+1 take dims 8s + 2t, +1 and
** columns 2t+8, 2t+9 take 16 + 8s + 2t, +1, so a[0] and a[2] are one q4_0 code pair's
** low and high nibbles. */
CU_HD static inline int64_t tsr_gqa_k_dim(int64_t blk, int s, int c) {
  const int t = (c % 8) / 2;
  return 32 * blk + (c >= 8 ? 16 : 0) + 8 * s + 2 * t + c % 2;
}

/* The head dim that row r (0..15) of O^T's m tile 2 blk + h (h 0, 1) holds: rows g and
** g + 8 take dims 2g and 2g + 1 (+ 16 for h 1), one pair of V values a key. */
CU_HD static inline int64_t tsr_gqa_v_dim(int64_t blk, int h, int r) {
  return 32 * blk + 16 * h + 2 * (r % 8) + r / 8;
}

/* A fragment of K (type T) for keys (rows) g and g + 8, k step s of block blk. */
template <int T>
CU_HD static inline void tsr_gqa_k_frag(uint32_t a[4], const char *row_g, const char *row_g8,
                                        int64_t blk, int s, int t) {
  const int64_t lo = tsr_gqa_k_dim(blk, s, 2 * t), hi = tsr_gqa_k_dim(blk, s, 2 * t + 8);
  a[0] = tsr_gqa_pair<T>(row_g, lo), a[1] = tsr_gqa_pair<T>(row_g8, lo);
  a[2] = tsr_gqa_pair<T>(row_g, hi), a[3] = tsr_gqa_pair<T>(row_g8, hi);
}

/* B fragment of Q^T for query row g: q holds the group's rows as f16, ldq apart. */
CU_HD static inline void tsr_gqa_q_frag(uint32_t b[2], const __half *q, int64_t ldq, int64_t blk,
                                        int s, int g, int t) {
  const __half *r = q + g * ldq;
  b[0] = *reinterpret_cast<const uint32_t *>(r + tsr_gqa_k_dim(blk, s, 2 * t));
  b[1] = *reinterpret_cast<const uint32_t *>(r + tsr_gqa_k_dim(blk, s, 2 * t + 8));
}

/* A fragments of V^T (type T) for block blk's m tiles (h 0 and 1): columns are the keys
** 2t, 2t+1, 2t+8, 2t+9 (rows[0..3], every one readable; live[i] false: zeros, chosen after
** the load so that no branch orders the loads), rows the dims of tsr_gqa_v_dim. */
template <int T>
CU_HD static inline void tsr_gqa_v_frag(uint32_t a[2][4], const char *const rows[4],
                                        const bool live[4], int64_t blk, int g) {
  for (int h = 0; h < 2; h++) { /* constant trips: unrolled without a pragma the host rejects */
    uint32_t p[4]; /* key i's values of dims 2g, 2g + 1 (+ 16 h) */
    for (int i = 0; i < 4; i++) {
      const uint32_t v = tsr_gqa_pair<T>(rows[i], tsr_gqa_v_dim(blk, h, g));
      p[i] = live[i] ? v : 0u;
    }
    a[h][0] = tsr_byte_perm(p[0], p[1], 0x5410); /* dim 2g: keys 2t, 2t + 1 */
    a[h][1] = tsr_byte_perm(p[0], p[1], 0x7632); /* dim 2g + 1 */
    a[h][2] = tsr_byte_perm(p[2], p[3], 0x5410); /* keys 2t + 8, 2t + 9 */
    a[h][3] = tsr_byte_perm(p[2], p[3], 0x7632);
  }
}

/* The 8x8 f16 matrix whose row l / 4, columns 2 (l % 4), +1 lane l holds, transposed,
** in the same layout. */
__device__ static inline uint32_t tsr_movmatrix_t(uint32_t x) {
  uint32_t r = 0;
#ifdef __CUDA_ARCH__
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(x));
#else
  (void)x;
#endif
  return r;
}

/* The kernel: with the tile kernels' helpers (tessera/cuda_attn_tile.cuh includes this
** header after them; the CPU test of the helpers above includes it alone). */
#ifdef TESSERA_CUDA_ATTN_TILE_CUH

/* Bytes of one warp's staged step (tsr_gqa_decode STAGED): 16 keys' K and V rows as raw
** bytes, as tsr_mma_copy_raw lands them; with V skipping (SKIP) K's only, since a step's
** V rows are read only once its weights say which are needed. */
__host__ __device__ static inline size_t tsr_gqa_stage_bytes(const struct tsr_tile_args *a,
                                                             bool skip = false) {
  return tsr_mma_raw_span(TSR_GQA_KEYS, a->k_nb1) +
         (skip ? 0 : tsr_mma_raw_span(TSR_GQA_KEYS, a->v_nb1));
}

/* Shared memory of a block: the Q rows of every band (n_bands) as f16 (and, staged, two
** steps a warp), then (reusing it) the warps' softmax states for their merge (with V
** skipping, a row's skipped weights too). */
static inline size_t tsr_gqa_smem(const struct tsr_tile_args *a, int n_bands, bool staged,
                                  bool skip = false) {
  const size_t q = sizeof(__half) * (size_t)n_bands * 8 * (size_t)(a->D + 8) +
                   (staged ? 2 * TSR_TILE_WARPS * tsr_gqa_stage_bytes(a, skip) : 0);
  const size_t merge =
      sizeof(float) * (size_t)TSR_TILE_WARPS * 8 * (size_t)(a->Dv + 2 + (skip ? 1 : 0));
  return q > merge ? q : merge;
}

/* B: the band policy; KT, VT: K and V types; NV: O^T's m tiles of 16 dims (Dv = 16 NV);
** STAGED: each warp copies its next step's K and V rows whole into shared memory by
** cp.async (16-byte chunks, the step's every byte in flight) while it computes this one,
** where unstaged the fragments load their pairs of values from global memory. SKIP: V
** skipping (tsr_tile_args.skip_below): a key whose weight against the running max is below
** the threshold for every q head of the group (rows past the group not counted), visible,
** weighed (some weight not 0) and not guarded (sink, recent), has its weights zeroed and
** added to the row's dropped sum; a step none of whose keys needs its V row (skipped,
** not seen, or weighed exactly 0 by every row) reads no V at all (its V rows come from
** global memory, after the weights, staged or not). grid (1, KV heads, key splits). */
template <class B, int KT, int VT, int NV, bool STAGED, bool SKIP>
__global__ void __launch_bounds__(32 * TSR_TILE_WARPS, 2) tsr_gqa_decode(tsr_tile_args a,
                                                                         B policy) {
  constexpr unsigned ALL = 0xffffffffu;
  extern __shared__ float tsr_gqa_smem_f[];
  __half *qs = reinterpret_cast<__half *>(tsr_gqa_smem_f); /* [bands][8][D + 8] */
  constexpr int64_t Dv = 16 * NV;
  const int64_t D = a.D, G = a.group, ldq = D + 8, hk = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;

  const int32_t qp = a.q_pos ? tsr_tile_pos(a.q_pos, a.q_pos_nb0, 0) : 0;
  const typename B::row brow = policy.row_of(qp);
  const float sg = a.scale * policy.gain(qp);
  const char *kbase = a.k + hk * a.k_nb2, *vbase = a.v + hk * a.v_nb2;
  int64_t j_lo, j_hi;
  tsr_tile_split_keys(a, &j_lo, &j_hi);

  /* staged: this warp's two steps of raw rows, after the Q rows; step j0 .. j0 + 16 (those
  ** before j_hi) copied into stage s */
  const int64_t kspan = tsr_mma_raw_span(TSR_GQA_KEYS, a.k_nb1);
  const int64_t stage = STAGED ? (int64_t)tsr_gqa_stage_bytes(&a, SKIP) : 0;
  constexpr bool V_STAGED = STAGED && !SKIP;
  unsigned char *raw = reinterpret_cast<unsigned char *>(qs + (size_t)B::n * 8 * ldq) +
                       (size_t)warp * 2 * stage;
  auto start_step = [&](int64_t j, int s) {
    const int64_t n = j_hi - j < TSR_GQA_KEYS ? j_hi - j : TSR_GQA_KEYS;
    tsr_mma_copy_raw(kbase + j * a.k_nb1, raw + s * stage, n * a.k_nb1, lane, 32);
    if (V_STAGED)
      tsr_mma_copy_raw(vbase + j * a.v_nb1, raw + s * stage + kspan, n * a.v_nb1, lane, 32);
  };
  constexpr int64_t STEP = (int64_t)TSR_GQA_KEYS * TSR_TILE_WARPS;
  if (STAGED) {
    if (j_lo + (int64_t)warp * TSR_GQA_KEYS < j_hi) start_step(j_lo + (int64_t)warp * TSR_GQA_KEYS, 0);
    asm volatile("cp.async.commit_group;\n" ::);
  }

  /* the group's rows of every band (rows past the group zeros), the first copies in flight:
  ** four values a thread at a time and several loads in flight, since every block waits for
  ** this before its first key (three bands' rows are a 3x longer wait than one's) */
  const int quads = B::n * 8 * (int)(ldq / 4); /* ldq = D + 8, D a multiple of 32 */
#pragma unroll 4
  for (int e = threadIdx.x; e < quads; e += blockDim.x) {
    int d4, r;
    const int b = cu_divmod(cu_divmod(e, (int)(ldq / 4), &d4), 8, &r);
    const int64_t d = 4 * (int64_t)d4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < G && d < D) {
      const char *row = tsr_tile_q_of(a, b) + (hk * G + r) * a.q_head + d * a.q_nb0;
      if (a.q_nb0 == 4 && (reinterpret_cast<uintptr_t>(row) & 15) == 0)
        v = *reinterpret_cast<const float4 *>(row);
      else
        v = make_float4(*reinterpret_cast<const float *>(row),
                        *reinterpret_cast<const float *>(row + a.q_nb0),
                        *reinterpret_cast<const float *>(row + 2 * a.q_nb0),
                        *reinterpret_cast<const float *>(row + 3 * a.q_nb0));
    }
    __half2 *to = reinterpret_cast<__half2 *>(qs + 4 * (size_t)e); /* 8-byte aligned */
    to[0] = __floats2half2_rn(v.x, v.y);
    to[1] = __floats2half2_rn(v.z, v.w);
  }
  __syncthreads();

  /* this thread's rows 2t and 2t + 1: running max (warp-uniform), its keys' share of the
  ** sum, and O^T's columns 2t, 2t + 1 */
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, o[NV][4];
  float sk[2] = {0.0f, 0.0f};   /* SKIP: the skipped keys' weights, on l's scale */
  uint32_t n_read = 0, n_skip = 0; /* SKIP, lanes t == 0: keys g, g + 8 weighed, skipped */
#pragma unroll
  for (int nv = 0; nv < NV; nv++) o[nv][0] = o[nv][1] = o[nv][2] = o[nv][3] = 0.0f;

  /* lane i < 16: the position of key j + i, -1 past the split (hidden as an empty cell is);
  ** loaded a step ahead, its latency behind a step's products */
  auto key_pos = [&](int64_t j) -> int32_t {
    if (lane >= TSR_GQA_KEYS || j + lane >= j_hi) return -1;
    return a.kv_pos ? tsr_tile_pos(a.kv_pos, a.kv_pos_nb0, j + lane) : 0;
  };
  int32_t kp_next = key_pos(j_lo + (int64_t)warp * TSR_GQA_KEYS);
  int s = 0; /* the stage this step's rows are in */
  for (int64_t j0 = j_lo + (int64_t)warp * TSR_GQA_KEYS; j0 < j_hi; j0 += STEP, s ^= 1) {
    const int32_t kp = kp_next;
    kp_next = key_pos(j0 + STEP);
    if (STAGED) { /* every lane is done with the other stage (the step before): refill it */
      __syncwarp();
      if (j0 + STEP < j_hi) start_step(j0 + STEP, s ^ 1);
      asm volatile("cp.async.commit_group;\n" ::);
      asm volatile("cp.async.wait_group 1;\n" ::); /* this step's copies, this lane's */
      __syncwarp();                                  /* and every lane's */
    }
    /* lane i < 16: key j0 + i's band (TSR_TILE_MAX_BANDS, 3: not seen) and mask bias */
    int band = TSR_TILE_MAX_BANDS;
    float bias = 0.0f;
    if (kp >= 0) {
      bool seen = true;
      if (a.kv_pos) {
        if (a.causal && kp > qp) seen = false;
        if (a.window > 0 && (int64_t)qp - kp >= a.window) seen = false;
      }
      if (seen && a.mask) {
        const char *p = a.mask + (j0 + lane) * a.mask_nb0;
        bias = a.mask_f16 ? __half2float(*reinterpret_cast<const __half *>(p))
                          : *reinterpret_cast<const float *>(p);
        seen = bias != -INFINITY;
      }
      if (seen) band = policy.band(brow, kp);
    }
    const unsigned bands = __reduce_or_sync(ALL, band < 3 ? 1u << band : 0u);
    if (!bands) continue;
    /* rows g, g + 8 of S^T are keys j0 + g, j0 + 8 + g: their bands and biases */
    const int band_g[2] = {__shfl_sync(ALL, band, g), __shfl_sync(ALL, band, g + 8)};
    const float bias_g[2] = {__shfl_sync(ALL, bias, g), __shfl_sync(ALL, bias, g + 8)};
    /* key i of the step's row: staged, in the warp's stage (rows past the split never
    ** copied: whatever bytes are there, never used); else in the cache, rows past the split
    ** reading its last key */
    const int64_t last = j_hi - 1;
    const char *kstep = STAGED ? tsr_mma_raw_at(kbase + j0 * a.k_nb1, raw + s * stage) : nullptr;
    const char *vstep =
        V_STAGED ? tsr_mma_raw_at(vbase + j0 * a.v_nb1, raw + s * stage + kspan) : nullptr;
    auto key_row = [&](bool staged, const char *step, const char *base, int64_t nb1, int i) {
      return staged ? step + i * nb1 : base + (j0 + i < last ? j0 + i : last) * nb1;
    };
    const char *krow[2] = {key_row(STAGED, kstep, kbase, a.k_nb1, g),
                           key_row(STAGED, kstep, kbase, a.k_nb1, g + 8)};

    float sc[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* S^T of each key's band */
    for (int b = 0; b < B::n; b++) {
      if (!(bands >> b & 1)) continue;
      float sb[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      const __half *qb = qs + (size_t)b * 8 * ldq;
#pragma unroll 2 /* a few blocks' loads in flight before their products */
      for (int blk = 0; blk < (int)(D / 32); blk++) {
#pragma unroll
        for (int step = 0; step < 2; step++) {
          uint32_t ka[4], qf[2];
          tsr_gqa_k_frag<KT>(ka, krow[0], krow[1], blk, step, t);
          tsr_gqa_q_frag(qf, qb, ldq, blk, step, g, t);
          tsr_mma_16816(sb, ka, qf[0], qf[1]);
        }
      }
#pragma unroll
      for (int c = 0; c < 4; c++)
        if (band_g[c / 2] == b) sc[c] = sb[c];
    }

    /* logits: element c is key g + 8 (c / 2), row 2t + c % 2 */
    float x[4];
#pragma unroll
    for (int c = 0; c < 4; c++) {
      if (band_g[c / 2] == 3) {
        x[c] = -INFINITY;
        continue;
      }
      float v = sc[c] * sg;
      if (a.softcap > 0.0f) v = a.softcap * tanhf(v / a.softcap);
      x[c] = v + bias_g[c / 2];
    }
    float p[4], f[2];
#pragma unroll
    for (int rr = 0; rr < 2; rr++) { /* row 2t + rr: elements rr and 2 + rr */
      float tmax = fmaxf(x[rr], x[2 + rr]);
      for (int off = 4; off < 32; off <<= 1) tmax = fmaxf(tmax, __shfl_xor_sync(ALL, tmax, off));
      const float m_new = fmaxf(m[rr], tmax);
      f[rr] = m[rr] == -INFINITY ? (m_new == -INFINITY ? 1.0f : 0.0f) : expf(m[rr] - m_new);
      p[rr] = x[rr] == -INFINITY ? 0.0f : expf(x[rr] - m_new);
      p[2 + rr] = x[2 + rr] == -INFINITY ? 0.0f : expf(x[2 + rr] - m_new);
      l[rr] = l[rr] * f[rr] + p[rr] + p[2 + rr];
      m[rr] = m_new;
    }
#pragma unroll
    for (int nv = 0; nv < NV; nv++) o[nv][0] *= f[0], o[nv][1] *= f[1], o[nv][2] *= f[0], o[nv][3] *= f[1];
    bool v_needed = true; /* some key of the step has its V row read */
    if (SKIP) {
      /* keys g and g + 8 (bits 0, 1): below the threshold for every row of the group, and
      ** weighed by some row; the quad's four lanes hold rows 0..7 */
      const bool r0 = 2 * t < G, r1 = 2 * t + 1 < G;
      const float tau = a.skip_below;
      int below = ((!r0 || p[0] < tau) && (!r1 || p[1] < tau) ? 1 : 0) |
                  ((!r0 || p[2] < tau) && (!r1 || p[3] < tau) ? 2 : 0);
      int used = ((r0 && p[0] != 0.0f) || (r1 && p[1] != 0.0f) ? 1 : 0) |
                 ((r0 && p[2] != 0.0f) || (r1 && p[3] != 0.0f) ? 2 : 0);
#pragma unroll
      for (int off = 1; off < 4; off <<= 1) {
        below &= __shfl_xor_sync(ALL, below, off);
        used |= __shfl_xor_sync(ALL, used, off);
      }
      /* the guards, by the keys' positions (lane i < 16 holds key i's) */
      const int32_t kp_of[2] = {__shfl_sync(ALL, kp, g), __shfl_sync(ALL, kp, g + 8)};
      bool skip[2], need[2];
#pragma unroll
      for (int c = 0; c < 2; c++) {
        const bool seen = band_g[c] < 3;
        const bool kept = kp_of[c] < a.sink || (int64_t)qp - kp_of[c] < a.recent;
        skip[c] = seen && (below >> c & 1) && (used >> c & 1) && !kept;
        need[c] = seen && (used >> c & 1) && !skip[c];
        if (t == 0) n_read += seen, n_skip += skip[c];
      }
#pragma unroll
      for (int rr = 0; rr < 2; rr++) {
        sk[rr] = sk[rr] * f[rr] + (skip[0] ? p[rr] : 0.0f) + (skip[1] ? p[2 + rr] : 0.0f);
        if (skip[0]) p[rr] = 0.0f;
        if (skip[1]) p[2 + rr] = 0.0f;
      }
      v_needed = __any_sync(ALL, need[0] || need[1]);
    }
    if (SKIP && !v_needed) continue;
    /* P^T's B fragment: S^T's halves (keys 0-7, 8-15) transposed */
    const uint32_t pb0 = tsr_movmatrix_t(cu_half2_bits(p[0], p[1]));
    const uint32_t pb1 = tsr_movmatrix_t(cu_half2_bits(p[2], p[3]));

    /* V^T's columns: keys 2t, 2t + 1, 2t + 8, 2t + 9 (lanes i < 16 hold key i's band) */
    const int key_of[4] = {2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9};
    const char *vrow[4];
    bool live[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      live[i] = __shfl_sync(ALL, band, key_of[i]) < 3;
      vrow[i] = key_row(V_STAGED, vstep, vbase, a.v_nb1, key_of[i]);
    }
#pragma unroll
    for (int nv = 0; nv < NV / 2; nv++) {
      uint32_t va[2][4];
      tsr_gqa_v_frag<VT>(va, vrow, live, nv, g);
      tsr_mma_16816(o[2 * nv], va[0], pb0, pb1);
      tsr_mma_16816(o[2 * nv + 1], va[1], pb0, pb1);
    }
  }

  /* the rows' sums over every key of the warp (lanes of one t hold one row pair) */
#pragma unroll
  for (int rr = 0; rr < 2; rr++)
    for (int off = 4; off < 32; off <<= 1) {
      l[rr] += __shfl_xor_sync(ALL, l[rr], off);
      if (SKIP) sk[rr] += __shfl_xor_sync(ALL, sk[rr], off);
    }
  if (SKIP && a.counters) { /* the keys this warp weighed and skipped */
    const uint32_t r = __reduce_add_sync(ALL, n_read), k = __reduce_add_sync(ALL, n_skip);
    if (lane == 0) {
      if (r) atomicAdd(&a.counters[0], (unsigned long long)r);
      if (k) atomicAdd(&a.counters[1], (unsigned long long)k);
    }
  }

  /* the warps' states through shared memory (the Q rows and stages are done with) */
  if (STAGED) asm volatile("cp.async.wait_group 0;\n" ::);
  __syncthreads();
  float *st = tsr_gqa_smem_f; /* [warp][row 8][Dv + 2 (+ 1)]: max, sum, O (, skipped) */
  const int64_t ld = Dv + 2 + (SKIP ? 1 : 0);
#pragma unroll
  for (int rr = 0; rr < 2; rr++) {
    float *sr = st + ((size_t)warp * 8 + 2 * t + rr) * ld;
    if (g == 0) sr[0] = m[rr], sr[1] = l[rr];
    if (SKIP && g == 0) sr[2 + Dv] = sk[rr];
#pragma unroll
    for (int nv = 0; nv < NV / 2; nv++) {
#pragma unroll
      for (int h = 0; h < 2; h++) {
        sr[2 + tsr_gqa_v_dim(nv, h, g)] = o[2 * nv + h][rr];
        sr[2 + tsr_gqa_v_dim(nv, h, g + 8)] = o[2 * nv + h][2 + rr];
      }
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < (int)(G * Dv); e += blockDim.x) {
    int d;
    const int r = cu_divmod(e, (int)Dv, &d);
    float M = -INFINITY;
    for (int w = 0; w < TSR_TILE_WARPS; w++) M = fmaxf(M, st[((size_t)w * 8 + r) * ld]);
    float L = 0.0f, O = 0.0f, S = 0.0f;
    for (int w = 0; w < TSR_TILE_WARPS; w++) {
      const float *sr = st + ((size_t)w * 8 + r) * ld;
      if (sr[0] == -INFINITY) continue; /* a warp that saw no key of this row */
      const float e_w = expf(sr[0] - M);
      L += sr[1] * e_w, O += sr[2 + d] * e_w;
      if (SKIP) S += sr[2 + Dv] * e_w;
    }
    const int64_t h = hk * G + r;
    if (SKIP && d == 0) { /* the row's dropped weights: merged by tsr_tile_combine, or counted */
      if (a.splits > 1)
        tsr_tile_skip_part(a)[h * a.splits + blockIdx.z] = S;
      else if (a.counters) {
        atomicAdd(&a.counters[2], 1ull);
        atomicAdd(&a.counters[3], (unsigned long long)llrintf(L > 0.0f ? S / L * 1e9f : 0.0f));
      }
    }
    if (a.splits > 1) { /* the partial state; tsr_tile_combine merges the splits */
      float *pr = a.part + (h * a.splits + blockIdx.z) * (Dv + 2);
      if (d == 0) pr[0] = M, pr[1] = L;
      pr[2 + d] = O;
    } else {
      const float inv = L > 0.0f ? 1.0f / L : 0.0f; /* no key: zeros */
      *reinterpret_cast<float *>(a.dst + h * a.dst_head + d * a.dst_nb0) = O * inv;
    }
  }
}

/* SKIP: V skipping (a->skip_below > 0; the caller picks it, so that a kernel plugin that
** does not skip compiles no skipping variant). */
template <class B, int KT, int VT, bool STAGED, bool SKIP = false>
static inline cudaError_t tsr_gqa_decode_run(const struct tsr_tile_args *a, const B &policy,
                                             cudaStream_t stream) {
  const size_t smem = tsr_gqa_smem(a, B::n, STAGED, SKIP);
  if (a->Dv == 128)
    return tsr_attn_run<tsr_gqa_decode<B, KT, VT, 8, STAGED, SKIP>>(a, policy, 16, smem, stream);
  if (a->Dv == 256)
    return tsr_attn_run<tsr_gqa_decode<B, KT, VT, 16, STAGED, SKIP>>(a, policy, 16, smem, stream);
  return tsr_attn_run<tsr_gqa_decode<B, KT, VT, 32, STAGED, SKIP>>(a, policy, 16, smem, stream);
}

/* q8_0 and q4_0 pairs: staged where tsr_gqa_staged and two steps a warp fit */
template <class B, int KT, int VT, bool SKIP>
static inline cudaError_t tsr_gqa_decode_pick(const struct tsr_tile_args *a, const B &policy,
                                              cudaStream_t stream) {
  if (tsr_gqa_staged(a) && tsr_gqa_smem(a, B::n, true, SKIP) <= TSR_MMA_SMEM_MAX)
    return tsr_gqa_decode_run<B, KT, VT, true, SKIP>(a, policy, stream);
  return tsr_gqa_decode_run<B, KT, VT, false, SKIP>(a, policy, stream);
}

template <class B, bool SKIP>
static inline cudaError_t tsr_gqa_decode_types(const struct tsr_tile_args *a, const B &policy,
                                               cudaStream_t stream) {
  if (a->k_type == T_F16)
    return tsr_gqa_decode_run<B, T_F16, T_F16, false, SKIP>(a, policy, stream);
  if (a->v_type == T_Q8_0) return tsr_gqa_decode_pick<B, T_Q8_0, T_Q8_0, SKIP>(a, policy, stream);
  if (a->k_type == T_Q8_0) return tsr_gqa_decode_pick<B, T_Q8_0, T_Q4_0, SKIP>(a, policy, stream);
  return tsr_gqa_decode_pick<B, T_Q4_0, T_Q4_0, SKIP>(a, policy, stream);
}

/* Launches a planned decode (tsr_gqa_decode_fits: one of the type pairs and value head
** dims above) with the band policy `policy`, skipping V rows where a->skip_below asks. */
template <class B>
static inline cudaError_t tsr_gqa_decode_launch(const struct tsr_tile_args *a, const B &policy,
                                                cudaStream_t stream) {
  if (a->skip_below > 0.0f) return tsr_gqa_decode_types<B, true>(a, policy, stream);
  return tsr_gqa_decode_types<B, false>(a, policy, stream);
}
#endif

#endif
