/*
** The tensor-core attention kernel of the GPU, prefill and decode: the same
** arguments, plan and semantics as the tiled kernel (tessera/cuda_attn_tile.cuh,
** which includes this header and routes a launch here when tsr_mma_attn_fits),
** with the two products on mma.sync m16n8k16 (f16 operands, f32 accumulation).
** Decode fills the GPU by splitting the keys over blocks (tsr_tile_combine
** merges them); its few rows leave most of a 16-row fragment idle, which costs
** nothing next to reading the cache.
**
** A warp owns 16 rows (a row: one query and one q head of the KV head's
** group); its S = Q K^T and its output O stay in registers as mma fragments
** and the online softmax runs on them, FlashAttention-2 style. Q, the K tile
** and the V tile are staged in shared memory as f16 (f16 caches by cp.async,
** other codecs decoded once per block) and read as fragments by ldmatrix. Past head
** dim 256 two warps share 16 rows: each sums half of the head dims into S,
** they exchange the halves through shared memory, and each accumulates half
** of the output, so no thread holds more than 128 accumulators.
**
** Bands (the band policy B, tessera/cuda_attn_tile.cuh): a warp computes S
** once per band any of its (row, key) pairs falls in this tile and keeps, per
** element, the band's value; a tile the policy finds uniform (one band for
** every row and key) computes it once, without per-element checks. Shared
** memory holds one band's Q rows at a time, restaged when a tile needs
** another, so a policy of several bands takes one band's shared memory (at
** head dim 512 three bands of Q would halve the blocks a multiprocessor
** holds); where the bands follow key position, a cache in position order
** meets them in turn and a block stages each once. With one band the rows are
** staged once, before the loop.
**
** Precision: Q, K, V and the probabilities are rounded to f16 (11-bit
** significand) before the products; sums, the softmax and the output are f32.
** The operands must fit f16 (|x| < 65504), as with any f16 attention.
*/
#ifndef TESSERA_CUDA_ATTN_MMA_CUH
#define TESSERA_CUDA_ATTN_MMA_CUH

#define TSR_MMA_WARPS TSR_TILE_WARPS

/* c += a b: a 16x16 row-major, b 16x8 col-major, c 16x8 (f32) */
__device__ static inline void tsr_mma_16816(float c[4], const uint32_t a[4], uint32_t b0,
                                            uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Four 8x8 f16 matrices from shared memory, lane l naming row l % 8 of matrix
** l / 8; .trans hands each lane the transposed fragment. */
__device__ static inline void tsr_ldsm4(uint32_t r[4], const __half *p) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ static inline void tsr_ldsm4_t(uint32_t r[4], const __half *p) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

/* Rows per block of a variant: W warps, WPR of them a 16 rows. */
template <int WPR, int W = TSR_MMA_WARPS> struct tsr_mma_shape {
  static constexpr int rows = W / WPR * 16;
};

static inline int64_t tsr_mma_rows(const struct tsr_tile_args *a) {
  if ((a->D > a->Dv ? a->D : a->Dv) <= 256) return tsr_mma_shape<1>::rows;
  return tsr_mma_wide(a) ? tsr_mma_shape<2, TSR_MMA_WIDE_WARPS>::rows : tsr_mma_shape<2>::rows;
}

static inline size_t tsr_mma_smem(const struct tsr_tile_args *a, int wpr, int tk, int warps) {
  const size_t rows = (size_t)(warps / wpr * 16);
  return sizeof(__half) * (rows * (size_t)(a->D + 8) +
                           (size_t)tk * (size_t)(a->D + 8) + (size_t)tk * (size_t)(a->Dv + 8)) +
         (wpr > 1 ? sizeof(float) * (size_t)warps * (size_t)(tk / 8 * 4) * 32 : 0) +
         sizeof(int32_t) * (size_t)tk;
}

/* Rows j0 .. j0+tk of q8_0 or q4_0 blocks (the tiers long contexts use) as f16 rows of ld
** halves, a quarter block (16 bytes of output) per step of a thread; rows 2-byte aligned
** (the caller checks). base may be raw rows copied into shared memory (tsr_mma_copy_raw, j0
** 0) or the cache itself. */
template <int T>
__device__ static inline void tsr_mma_stage_quarters(const char *base, int64_t nb1, int64_t D,
                                                   int64_t j0, int tk, const int32_t *kpos,
                                                   __half *dst, int64_t ld) {
  const int nq = (int)(D / 8); /* quarter blocks a row */
  for (int e = threadIdx.x; e < tk * nq; e += blockDim.x) {
    int q;
    const int t = cu_divmod(e, nq, &q);
    const uint8_t *block = reinterpret_cast<const uint8_t *>(base + (j0 + t) * nb1) +
                           (q / 4) * cu_block_bytes(T);
    *reinterpret_cast<uint4 *>(dst + t * ld + q * 8) =
        kpos[t] >= 0 ? tsr_dq_quarter_h<T>(block, q % 4) : make_uint4(0u, 0u, 0u, 0u);
  }
}

/* Where tsr_mma_copy_raw puts src's first byte: dst plus src's offset in its 16 bytes. */
__device__ static inline const char *tsr_mma_raw_at(const char *src, const unsigned char *dst) {
  return reinterpret_cast<const char *>(dst) + ((uintptr_t)src & 15);
}

/* Starts the copy of `bytes` bytes at src into shared memory at dst (16-byte
** aligned) by 16-byte cp.async, all in flight at once (src's first byte lands at
** tsr_mma_raw_at), shared by the block's threads or (tid, nthreads) given, a warp's
** lanes. The last chunk reads only what is left. */
__device__ static inline void tsr_mma_copy_raw(const char *src, unsigned char *dst, int64_t bytes,
                                               int tid = -1, int nthreads = 0) {
  if (tid < 0) tid = (int)threadIdx.x, nthreads = (int)blockDim.x;
  const int off = (int)((uintptr_t)src & 15);
  const char *start = src - off;
  bytes += off;
  for (int64_t c = (int64_t)tid * 16; c < bytes; c += (int64_t)nthreads * 16) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst + c);
    const int n = bytes - c < 16 ? (int)(bytes - c) : 16;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(start + c), "r"(n));
  }
}

/* Stages rows j0 .. j0+TK of one KV head's K or V as f16 rows of ld halves; an
** empty cell or a key past the end is zeros, so a hidden key's probability 0
** never meets a NaN. f16 rows in place take 16-byte loads; q8_0 and q4_0 go through
** tsr_mma_stage_quarters (base may be raw rows in shared memory, j0 0). */
__device__ static inline void tsr_mma_stage(const char *base, int32_t type, int64_t nb0,
                                            int64_t nb1, int64_t D, int64_t j0, int tk,
                                            const int32_t *kpos, __half *dst, int64_t ld) {
  if (type == T_F16 && nb0 == 2 && D % 8 == 0 && nb1 % 16 == 0 && ((uintptr_t)base & 15) == 0) {
    /* asynchronous 16-byte copies, all in flight at once; a hidden row reads
    ** nothing and is zero-filled. The caller waits (tsr_mma_stage_wait). */
    const int cpr = (int)(D / 8); /* 16-byte chunks a row */
    for (int e = threadIdx.x; e < tk * cpr; e += blockDim.x) {
      int c;
      const int t = cu_divmod(e, cpr, &c);
      const bool live = kpos[t] >= 0;
      const char *src = live ? base + (j0 + t) * nb1 + c * 16 : base;
      const unsigned d = (unsigned)__cvta_generic_to_shared(dst + t * ld + c * 8);
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                   "r"(live ? 16 : 0));
    }
    return;
  }
  if (D % 32 == 0 && nb1 % 2 == 0 && ((uintptr_t)base & 1) == 0) {
    if (type == T_Q8_0) return tsr_mma_stage_quarters<T_Q8_0>(base, nb1, D, j0, tk, kpos, dst, ld);
    if (type == T_Q4_0) return tsr_mma_stage_quarters<T_Q4_0>(base, nb1, D, j0, tk, kpos, dst, ld);
  }
  for (int e = threadIdx.x; e < tk * (int)D; e += blockDim.x) {
    int d;
    const int t = cu_divmod(e, (int)D, &d);
    dst[t * ld + d] =
        __float2half_rn(kpos[t] >= 0 ? dq_rt(type, base + (j0 + t) * nb1, d, nb0) : 0.0f);
  }
}

/* s[NT][4] += the warp's 16 rows of band b times the tile's keys, over head
** dims d_off .. d_off + Dw. */
template <int NT>
__device__ static inline void tsr_mma_qk(float (*s)[4], const __half *qrows, const __half *ks,
                                         int64_t ld, int64_t d_off, int64_t Dw, int lane) {
  const int mi = lane / 8, mr = lane % 8;
  for (int64_t k0 = 0; k0 < Dw; k0 += 16) {
    uint32_t qa[4];
    tsr_ldsm4(qa, qrows + ((mi % 2) * 8 + mr) * ld + d_off + k0 + (mi / 2) * 8);
#pragma unroll
    for (int nt = 0; nt < NT; nt += 2) {
      uint32_t kb[4];
      tsr_ldsm4(kb, ks + (nt * 8 + (mi / 2) * 8 + mr) * ld + d_off + k0 + (mi % 2) * 8);
      tsr_mma_16816(s[nt], qa, kb[0], kb[1]);
      tsr_mma_16816(s[nt + 1], qa, kb[2], kb[3]);
    }
  }
}

/* B: the band policy; DVW: output dims per warp at most (Dv / WPR <= DVW); WPR: warps per
** 16 rows; TK: keys per tile (32 or 64); PIPE: the pipelined tile loop
** (tsr_tile_args.pipelined; a template parameter, so the default loop keeps its
** registers); W: warps a block (TSR_MMA_WARPS, or TSR_MMA_WIDE_WARPS: tsr_mma_wide). grid
** (row tiles of one KV head, KV heads, key splits), 32 W threads. */
template <class B, int DVW, int WPR, int TK, bool PIPE, int W>
__global__ void __launch_bounds__(32 * W) tsr_mma_attn(tsr_tile_args a, B policy) {
  constexpr int RB = tsr_mma_shape<WPR, W>::rows, NT = TK / 8, NV = DVW / 8;
  constexpr float LOG2E = 1.4426950408889634f;
  extern __shared__ __align__(16) unsigned char tsr_mma_smem_raw[];
  const int64_t D = a.D, Dv = a.Dv, ldq = a.D + 8, ldv = a.Dv + 8, G = a.group;
  __half *qs = reinterpret_cast<__half *>(tsr_mma_smem_raw); /* [RB][D+8]: one band */
  __half *ks = qs + (size_t)RB * ldq;                         /* [TK][D+8] */
  __half *vs = ks + (size_t)TK * ldq;                         /* [TK][Dv+8] */
  float *sx = reinterpret_cast<float *>(vs + (size_t)TK * ldv); /* WPR 2: [warps][NT*4][32] */
  int32_t *kpos = reinterpret_cast<int32_t *>(sx + (WPR > 1 ? W * NT * 4 * 32 : 0));
  /* kv_double (pipelined, where it fits): a second K tile, V tile and positions, filled
  ** for the next tile while this one is computed */
  __half *ks2 = reinterpret_cast<__half *>(kpos + TK), *vs2 = ks2 + (size_t)TK * ldq;
  int32_t *kpos2 = reinterpret_cast<int32_t *>(vs2 + (size_t)TK * ldv);
  const bool dbl = PIPE && a.kv_double;
  /* raw_kv (the default loop, where the pipelined one keeps its second buffers): a q8_0 or
  ** q4_0 tile copied whole as bytes, every 16-byte load in flight at once, then decoded from
  ** shared memory, where a thread decoding a block from global memory waits on its loads */
  const bool raw_k = !PIPE && (a.raw_kv & 1), raw_v = !PIPE && (a.raw_kv & 2);
  unsigned char *raw_kb = reinterpret_cast<unsigned char *>(kpos + TK);
  unsigned char *raw_vb = raw_kb + (raw_k ? tsr_mma_raw_span(TK, a.k_nb1) : 0);
  __shared__ int32_t q_lo, q_hi;

  const int64_t hk = blockIdx.y, r0 = (int64_t)blockIdx.x * RB;
  const int64_t n_rows = a.Nq * G - r0 < RB ? a.Nq * G - r0 : RB;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const int rw0 = warp / WPR * 16, part = warp % WPR;
  /* pipelined: a warp whose rows hold no query skips the products (warp-uniform: the
  ** partner of WPR 2 shares the rows; it still stages and meets every barrier) */
  const bool computes = !PIPE || rw0 < n_rows;
  const int64_t Dw = D / WPR, Dvw = Dv / WPR, d_off = part * Dw, v_off = part * Dvw;

  /* the Q tile: zeros in 16-byte stores (rows past the last query, as most of a decode
  ** tile is, stay so), then the live rows of one band a value each (stage_q): the one
  ** band's at once, else a band when a tile first needs it */
  for (int e = threadIdx.x; e < RB * (int)ldq / 8; e += blockDim.x)
    reinterpret_cast<uint4 *>(qs)[e] = make_uint4(0u, 0u, 0u, 0u);
  __syncthreads();
  auto stage_q = [&](int b) {
    for (int e = threadIdx.x; e < (int)n_rows * (int)D; e += blockDim.x) {
      int d, hg;
      const int r = cu_divmod(e, (int)D, &d);
      const int iq = cu_divmod((int)r0 + r, (int)G, &hg); /* query, and q head in the group */
      qs[r * ldq + d] = __float2half_rn(*reinterpret_cast<const float *>(
          tsr_tile_q_of(a, b) + iq * a.q_row + (hk * G + hg) * a.q_head + d * a.q_nb0));
    }
  };
  /* the band whose rows qs holds (-1: none yet); use_band stages (block-uniform calls only) */
  int q_band = B::n == 1 ? 0 : -1;
  if (q_band == 0) stage_q(0);
  auto use_band = [&](int b) {
    if (b == q_band) return;
    __syncthreads(); /* every warp is done with the rows staged */
    stage_q(b);
    __syncthreads();
    q_band = b;
  };
  if (threadIdx.x == 0) {
    int32_t lo, hi;
    tsr_tile_q_range(a, r0, n_rows, &lo, &hi);
    q_lo = lo, q_hi = hi;
  }

  /* this thread's two rows: g and g + 8 of its warp's 16 */
  bool row_ok[2];
  int32_t qp[2];
  typename B::row brow[2];
  int64_t iq_of[2];
  float sg[2], m[2], l[2], o[NV][4];
#pragma unroll
  for (int rr = 0; rr < 2; rr++) {
    const int64_t r = rw0 + g + 8 * rr;
    row_ok[rr] = r < n_rows;
    iq_of[rr] = (r0 + r) / G;
    qp[rr] = a.q_pos && row_ok[rr] ? tsr_tile_pos(a.q_pos, a.q_pos_nb0, iq_of[rr]) : 0;
    brow[rr] = policy.row_of(qp[rr]);
    sg[rr] = a.scale * policy.gain(qp[rr]);
    m[rr] = -INFINITY, l[rr] = 0.0f;
  }
#pragma unroll
  for (int nv = 0; nv < NV; nv++) o[nv][0] = o[nv][1] = o[nv][2] = o[nv][3] = 0.0f;
  const char *kbase = a.k + hk * a.k_nb2, *vbase = a.v + hk * a.v_nb2;
  __syncthreads();
  const int64_t qlo = q_lo, qhi = q_hi;
  const typename B::span bspan = policy.span_of(q_lo, q_hi); /* the block's rows */

  int64_t j_lo, j_hi;
  tsr_tile_split_keys(a, &j_lo, &j_hi);
  /* key j's position as kpos holds it: -1 past the split, 0 without positions */
  auto key_pos = [&](int64_t j) -> int32_t {
    return j >= j_hi ? -1 : a.kv_pos ? tsr_tile_pos(a.kv_pos, a.kv_pos_nb0, j) : 0;
  };
  /* a thread's key position of the next tile, loaded a tile ahead (its latency hidden
  ** behind a tile's products, where a load at the tile's start stalls every warp) */
  int32_t kp_ahead = -1;
  if (threadIdx.x < TK) kp_ahead = key_pos(j_lo + threadIdx.x);
  /* the tile's positions and K/V in shared memory (kv_double: alternating buffers) */
  int32_t *kpt = kpos;
  __half *kt = ks, *vt = vs;
  if (dbl) { /* the first tile staged ahead of the loop, the second's positions loaded */
    if (threadIdx.x < TK) kpos[threadIdx.x] = kp_ahead;
    __syncthreads();
    tsr_mma_stage(kbase, a.k_type, a.k_nb0, a.k_nb1, D, j_lo, TK, kpos, ks, ldq);
    tsr_mma_stage(vbase, a.v_type, a.v_nb0, a.v_nb1, Dv, j_lo, TK, kpos, vs, ldv);
    asm volatile("cp.async.commit_group;\n" ::);
    if (threadIdx.x < TK) kp_ahead = key_pos(j_lo + TK + threadIdx.x);
  }
  /* raw copies: the next tile's bytes were started before this one's products (a dead
  ** tile's land unused and the tile after it drains them) */
  bool raw_next = false;
  /* starts the raw copy of keys j .. j+n (the split's only: those past it are never decoded) */
  auto start_raw = [&](int64_t j, int64_t n) {
    if (raw_k) tsr_mma_copy_raw(kbase + j * a.k_nb1, raw_kb, n * a.k_nb1);
    if (raw_v) tsr_mma_copy_raw(vbase + j * a.v_nb1, raw_vb, n * a.v_nb1);
    asm volatile("cp.async.commit_group;\n" ::);
  };
  for (int64_t j0 = j_lo, it = 0; j0 < j_hi; j0 += TK, it++) {
    const int64_t nk = j_hi - j0 < TK ? j_hi - j0 : TK;
    const bool raw_here = raw_next;
    raw_next = false;
    if (dbl) { /* this tile's buffers; the next tile's positions, then its K/V in flight */
      kpt = it & 1 ? kpos2 : kpos, kt = it & 1 ? ks2 : ks, vt = it & 1 ? vs2 : vs;
      int32_t *kp_next = it & 1 ? kpos : kpos2;
      __half *kt_next = it & 1 ? ks : ks2, *vt_next = it & 1 ? vs : vs2;
      __syncthreads(); /* every warp is done with the buffers of the tile before */
      if (threadIdx.x < TK) kp_next[threadIdx.x] = kp_ahead;
      __syncthreads();
      if (j0 + TK < j_hi) {
        tsr_mma_stage(kbase, a.k_type, a.k_nb0, a.k_nb1, D, j0 + TK, TK, kp_next, kt_next, ldq);
        tsr_mma_stage(vbase, a.v_type, a.v_nb0, a.v_nb1, Dv, j0 + TK, TK, kp_next, vt_next, ldv);
      }
      asm volatile("cp.async.commit_group;\n" ::);
      if (threadIdx.x < TK) kp_ahead = key_pos(j0 + 2 * TK + threadIdx.x);
      asm volatile("cp.async.wait_group 1;\n" ::); /* this tile's copies */
      __syncthreads();
    } else { /* tsr_tile_next_pos's barriers and values, the load a tile early */
      __syncthreads();
      if (threadIdx.x < TK) kpos[threadIdx.x] = kp_ahead;
      /* raw bytes started a tile ahead: this thread's have landed, and the barrier makes
      ** every thread's visible with the positions */
      if (raw_here) asm volatile("cp.async.wait_group 0;\n" ::);
      __syncthreads();
      if (threadIdx.x < TK) kp_ahead = key_pos(j0 + TK + threadIdx.x);
    }
    /* every warp classifies the tile alike: dead (no key visible to any row:
    ** empty cells, every row's future, past every window), full (every key
    ** visible to every row, in one band, no mask: no per-element checks), or
    ** mixed */
    int32_t kmin = INT32_MAX, kmax = -1;
    bool any_live = false, all_in = true;
#pragma unroll
    for (int i = 0; i < TK / 32; i++) {
      const int32_t kp = kpt[lane + 32 * i];
      if (kp >= 0) {
        kmin = kp < kmin ? kp : kmin, kmax = kp > kmax ? kp : kmax;
        any_live |= !a.kv_pos || ((!a.causal || kp <= qhi) && (a.window <= 0 || qlo - kp < a.window));
      } else {
        all_in = false;
      }
    }
    if (!__any_sync(0xffffffffu, any_live)) continue;
    all_in = __all_sync(0xffffffffu, all_in);
    kmin = __reduce_min_sync(0xffffffffu, kmin), kmax = __reduce_max_sync(0xffffffffu, kmax);
    int full_band = -1;
    if (all_in && !a.mask &&
        (!a.kv_pos || ((!a.causal || kmax <= qlo) && (a.window <= 0 || qhi - kmin < a.window)))) {
      /* several bands: without key positions none is known uniform */
      full_band = B::n > 1 && !a.kv_pos ? -1 : policy.uniform(bspan, kmin, kmax);
    }
    if (!dbl) {
      const char *kr = nullptr, *vr = nullptr; /* the raw rows in shared memory */
      if (raw_k || raw_v) {
        if (!raw_here) {
          asm volatile("cp.async.wait_group 0;\n" ::); /* a dead tile's bytes still landing */
          __syncthreads();
          start_raw(j0, nk);
          asm volatile("cp.async.wait_group 0;\n" ::);
          __syncthreads();
        }
        kr = tsr_mma_raw_at(kbase + j0 * a.k_nb1, raw_kb);
        vr = tsr_mma_raw_at(vbase + j0 * a.v_nb1, raw_vb);
      }
      if (raw_k) tsr_mma_stage(kr, a.k_type, a.k_nb0, a.k_nb1, D, 0, TK, kpos, ks, ldq);
      else tsr_mma_stage(kbase, a.k_type, a.k_nb0, a.k_nb1, D, j0, TK, kpos, ks, ldq);
      asm volatile("cp.async.commit_group;\n" ::);
      if (raw_v) tsr_mma_stage(vr, a.v_type, a.v_nb0, a.v_nb1, Dv, 0, TK, kpos, vs, ldv);
      else tsr_mma_stage(vbase, a.v_type, a.v_nb0, a.v_nb1, Dv, j0, TK, kpos, vs, ldv);
      asm volatile("cp.async.commit_group;\n" ::);
      /* pipelined: the V tile may still arrive while Q K^T and the softmax run */
      if (PIPE) asm volatile("cp.async.wait_group 1;\n" ::);
      else asm volatile("cp.async.wait_group 0;\n" ::);
      __syncthreads();
      /* every thread is done with the raw bytes: the next tile's start landing */
      if ((raw_k || raw_v) && j0 + TK < j_hi) {
        const int64_t nk2 = j_hi - j0 - TK < TK ? j_hi - j0 - TK : TK;
        start_raw(j0 + TK, nk2);
        raw_next = true;
      }
    }

    float s[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
    /* mixed tiles: the band of element (nt, c), row g + 8 (c / 2) and key
    ** nt 8 + 2 t4 + c % 2; TSR_TILE_MAX_BANDS (3) is hidden */
    uint8_t band_of[NT][4];
    if (full_band >= 0) {
      use_band(full_band);
      if (computes) tsr_mma_qk<NT>(s, qs + (size_t)rw0 * ldq, kt, ldq, d_off, Dw, lane);
    } else {
      unsigned bands = 0; /* this warp's */
      if (computes) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
          for (int c = 0; c < 4; c++) {
            const int rr = c / 2;
            const int32_t kp = kpt[nt * 8 + 2 * t4 + c % 2];
            bool seen = kp >= 0 && row_ok[rr];
            if (seen && a.kv_pos) {
              if (a.causal && kp > qp[rr]) seen = false;
              if (a.window > 0 && (int64_t)qp[rr] - kp >= a.window) seen = false;
            }
            const int band = !seen ? TSR_TILE_MAX_BANDS : policy.band(brow[rr], kp);
            band_of[nt][c] = (uint8_t)band;
            bands |= band < 3 ? 1u << band : 0u;
          }
        bands = __reduce_or_sync(0xffffffffu, bands);
      }
      /* the block's bands, the one staged first */
      unsigned block_bands = 1u;
      if (B::n > 1)
        block_bands = (__syncthreads_or(bands & 1u) ? 1u : 0u) |
                      (__syncthreads_or(bands & 2u) ? 2u : 0u) |
                      (__syncthreads_or(bands & 4u) ? 4u : 0u);
      const int first = q_band < 0 ? 0 : q_band;
      for (int i = 0; i < B::n; i++) {
        const int b = (first + i) % B::n;
        if (!(block_bands >> b & 1)) continue;
        use_band(b);
        if (!computes || !(bands >> b & 1)) continue;
        float sb[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) sb[nt][0] = sb[nt][1] = sb[nt][2] = sb[nt][3] = 0.0f;
        tsr_mma_qk<NT>(sb, qs + (size_t)rw0 * ldq, kt, ldq, d_off, Dw, lane);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
          for (int c = 0; c < 4; c++)
            if (band_of[nt][c] == b) s[nt][c] = sb[nt][c];
      }
    }
    if (WPR > 1) { /* the partner warp summed the other half of the head dims */
      float *mine = sx + (size_t)warp * NT * 4 * 32, *theirs = sx + (size_t)(warp ^ 1) * NT * 4 * 32;
#pragma unroll
      for (int i = 0; i < NT * 4; i++) mine[i * 32 + lane] = s[i / 4][i % 4];
      /* only the partner reads them: a barrier of the pair (named 1 + pair; 0 is the block's),
      ** so pairs run on apart. The next tile's block barriers come before either warp
      ** writes its half again. Immediate ids: a register id reserves all 16. */
      static_assert(W <= 8, "pair barriers 1..4");
      switch (warp / 2) {
      case 0: asm volatile("bar.sync 1, 64;\n" ::: "memory"); break;
      case 1: asm volatile("bar.sync 2, 64;\n" ::: "memory"); break;
      case 2: asm volatile("bar.sync 3, 64;\n" ::: "memory"); break;
      default: asm volatile("bar.sync 4, 64;\n" ::: "memory"); break;
      }
#pragma unroll
      for (int i = 0; i < NT * 4; i++) s[i / 4][i % 4] += theirs[i * 32 + lane];
    }

    if (computes) {
      /* logits in log2 units (exp2 of their differences is the softmax's exp) */
      if (full_band >= 0 && !(a.softcap > 0.0f)) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
          for (int c = 0; c < 4; c++) s[nt][c] *= sg[c / 2] * LOG2E;
      } else {
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
          for (int c = 0; c < 4; c++) {
            if (full_band < 0 && band_of[nt][c] == 3) {
              s[nt][c] = -INFINITY;
              continue;
            }
            float x = s[nt][c] * sg[c / 2];
            if (a.softcap > 0.0f) x = a.softcap * tanhf(x / a.softcap);
            if (a.mask) {
              const char *p = a.mask + iq_of[c / 2] * a.mask_nb1 +
                              (j0 + nt * 8 + 2 * t4 + c % 2) * a.mask_nb0;
              x += a.mask_f16 ? __half2float(*reinterpret_cast<const __half *>(p))
                              : *reinterpret_cast<const float *>(p);
            }
            s[nt][c] = x * LOG2E;
          }
      }

      /* the online softmax of rows g (c 0, 1) and g + 8 (c 2, 3) */
#pragma unroll
      for (int rr = 0; rr < 2; rr++) {
        float tmax = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) tmax = fmaxf(tmax, fmaxf(s[nt][2 * rr], s[nt][2 * rr + 1]));
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
        const float m_new = fmaxf(m[rr], tmax);
        /* nothing seen yet: keep (zeros); first keys: the zeros need no rescale */
        const float f = m_new == -INFINITY ? 1.0f : m[rr] == -INFINITY ? 0.0f : exp2f(m[rr] - m_new);
        float psum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
          for (int c = 2 * rr; c < 2 * rr + 2; c++) {
            const float p = s[nt][c] == -INFINITY ? 0.0f : exp2f(s[nt][c] - m_new);
            s[nt][c] = p;
            psum += p;
          }
        l[rr] = l[rr] * f + psum; /* this thread's share; the quad's are summed at the end */
        m[rr] = m_new;
#pragma unroll
        for (int nv = 0; nv < NV; nv++) o[nv][2 * rr] *= f, o[nv][2 * rr + 1] *= f;
      }
    }
    if (PIPE && !dbl) { /* the V tile, every thread's copies */
      asm volatile("cp.async.wait_group 0;\n" ::);
      __syncthreads();
    }
    if (computes) {
      /* O += P V over this warp's output dims: V rows [key][dv] through ldmatrix.trans */
      const int mi = lane / 8, mr = lane % 8;
#pragma unroll
      for (int kc = 0; kc < TK / 16; kc++) {
        uint32_t pa[4];
        pa[0] = cu_half2_bits(s[2 * kc][0], s[2 * kc][1]);
        pa[1] = cu_half2_bits(s[2 * kc][2], s[2 * kc][3]);
        pa[2] = cu_half2_bits(s[2 * kc + 1][0], s[2 * kc + 1][1]);
        pa[3] = cu_half2_bits(s[2 * kc + 1][2], s[2 * kc + 1][3]);
#pragma unroll
        for (int nv = 0; nv < NV; nv += 2) {
          if (nv * 8 >= Dvw) break;
          uint32_t vb[4];
          tsr_ldsm4_t(vb, vt + (kc * 16 + (mi % 2) * 8 + mr) * ldv + v_off + nv * 8 + (mi / 2) * 8);
          tsr_mma_16816(o[nv], pa, vb[0], vb[1]);
          tsr_mma_16816(o[nv + 1], pa, vb[2], vb[3]);
        }
      }
    }
  }
  if (raw_k || raw_v) asm volatile("cp.async.wait_group 0;\n" ::); /* a dead last tile's bytes */

#pragma unroll
  for (int rr = 0; rr < 2; rr++) {
    float lt = l[rr];
    lt += __shfl_xor_sync(0xffffffffu, lt, 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    if (!row_ok[rr]) continue;
    const int64_t R = r0 + rw0 + g + 8 * rr, h = hk * G + R % G;
    if (a.splits > 1) { /* the partial state, max in natural units; tsr_tile_combine merges */
      float *pr = a.part + ((iq_of[rr] * a.Hq + h) * a.splits + blockIdx.z) * (Dv + 2);
      if (t4 == 0 && part == 0) pr[0] = m[rr] / LOG2E, pr[1] = lt;
#pragma unroll
      for (int nv = 0; nv < NV; nv++) {
        if (nv * 8 >= Dvw) break;
        const int64_t d = v_off + nv * 8 + 2 * t4;
        pr[2 + d] = o[nv][2 * rr], pr[3 + d] = o[nv][2 * rr + 1];
      }
      continue;
    }
    const float inv = lt > 0.0f ? 1.0f / lt : 0.0f; /* no key: zeros */
    char *out = a.dst + iq_of[rr] * a.dst_row + h * a.dst_head;
#pragma unroll
    for (int nv = 0; nv < NV; nv++) {
      if (nv * 8 >= Dvw) break;
      const int64_t d = v_off + nv * 8 + 2 * t4;
      *reinterpret_cast<float *>(out + d * a.dst_nb0) = o[nv][2 * rr] * inv;
      *reinterpret_cast<float *>(out + (d + 1) * a.dst_nb0) = o[nv][2 * rr + 1] * inv;
    }
  }
}

/* Whether a launch goes to the tensor cores: head dims in steps of 16 (of 32
** past 256, split over two warps). */
static inline bool tsr_mma_attn_fits(const struct tsr_tile_args *a) {
  const int64_t d = a->D > a->Dv ? a->D : a->Dv;
  return a->D % 16 == 0 && a->Dv % 16 == 0 &&
         d <= TSR_TILE_MAX_D && (d <= 256 || (a->D % 32 == 0 && a->Dv % 32 == 0));
}

/* The most dynamic shared memory a block of sm_90 takes. */
#define TSR_MMA_SMEM_MAX (227 * 1024)

/* Blocks of kernel K with `smem` bytes of dynamic shared memory a multiprocessor of
** the current device holds: the least of what its registers (read from the compiled
** kernel once, allocated 256 a warp) and its shared memory (1 KB a block is the
** system's) allow. 0 when the runtime does not say. */
template <auto K>
static inline int tsr_mma_blocks_per_sm(size_t smem, int warps) {
  static int regs = -1, sm_regs = 0, sm_smem = 0; /* per kernel: one device's figures */
  if (regs < 0) {
    cudaFuncAttributes fa;
    int dev = 0;
    if (cudaFuncGetAttributes(&fa, K) != cudaSuccess || cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sm_regs, cudaDevAttrMaxRegistersPerMultiprocessor, dev) !=
            cudaSuccess ||
        cudaDeviceGetAttribute(&sm_smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) !=
            cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    regs = fa.numRegs;
  }
  const int warp_regs = (regs * 32 + 255) / 256 * 256;
  const int by_regs = warp_regs ? sm_regs / (warp_regs * warps) : 0;
  const int by_smem = (int)((size_t)sm_smem / (smem + 1024));
  return by_regs < by_smem ? by_regs : by_smem;
}

/* Whether `extra` bytes of shared memory past `smem` fit a block of kernel K (of `warps`
** warps) and keep as many blocks a multiprocessor as without them (at head dim 512 most
** extras would halve them); with keep_blocks false, whether a block still fits at all. */
template <auto K>
static inline bool tsr_mma_extra_fits(size_t smem, size_t extra, int warps,
                                      bool keep_blocks = true) {
  const int with = tsr_mma_blocks_per_sm<K>(smem + extra, warps);
  return smem + extra <= TSR_MMA_SMEM_MAX && with > 0 &&
         (!keep_blocks || with >= tsr_mma_blocks_per_sm<K>(smem, warps));
}

/* W: warps a block; the wide blocks (TSR_MMA_WIDE_WARPS) run the default loop only. */
template <class B, int DVW, int WPR, int TK, int W = TSR_MMA_WARPS>
static inline cudaError_t tsr_mma_attn_run(const struct tsr_tile_args *a, const B &policy,
                                           cudaStream_t stream) {
  constexpr int rows = tsr_mma_shape<WPR, W>::rows;
  const size_t smem = tsr_mma_smem(a, WPR, TK, W);
  struct tsr_tile_args p = *a;
  if (W != TSR_MMA_WARPS || !a->pipelined) {
    constexpr auto kernel = tsr_mma_attn<B, DVW, WPR, TK, false, W>;
    const size_t raw = tsr_mma_raw_bytes(&p, TK);
    /* a decode step's rows (one row tile a KV head) take the raw copies even where they
    ** halve the blocks a multiprocessor holds: decoding a tile from global memory, a thread
    ** waits on each block's loads in turn (the D 512 q8_0/q4_0 decode ran at 224 GB/s so),
    ** where the raw copy has every load of a tile in flight and the next tile's in flight
    ** during this one's products */
    const bool one_row_tile = a->Nq * a->group <= rows;
    if (raw && !tsr_mma_extra_fits<kernel>(smem, raw, W, !one_row_tile)) p.raw_kv = 0;
    if (p.raw_kv) { /* refused (a device granting less shared memory): the decode from
                    ** global memory, the same values */
      if (tsr_attn_run<kernel>(&p, policy, rows, smem + raw, stream, 32 * W) == cudaSuccess)
        return cudaSuccess;
      p.raw_kv = 0;
    }
    return tsr_attn_run<kernel>(&p, policy, rows, smem, stream, 32 * W);
  }
  if constexpr (W == TSR_MMA_WARPS) { /* the pipelined loop is compiled for 4 warps only */
    p.raw_kv = 0;
    /* the second buffers of the pipelined loop */
    const size_t second = sizeof(__half) * (size_t)TK * (size_t)(a->D + 8 + a->Dv + 8) +
                          sizeof(int32_t) * (size_t)TK;
    constexpr auto kernel = tsr_mma_attn<B, DVW, WPR, TK, true, W>;
    p.kv_double = tsr_mma_extra_fits<kernel>(smem, second, W);
    return tsr_attn_run<kernel>(&p, policy, rows, p.kv_double ? smem + second : smem, stream,
                                32 * W);
  }
  return cudaErrorInvalidValue; /* not reached: wide blocks run the default loop */
}

template <class B>
static inline cudaError_t tsr_mma_attn_launch(const struct tsr_tile_args *a, const B &policy,
                                              cudaStream_t stream) {
  const int64_t d = a->D > a->Dv ? a->D : a->Dv;
  if (d <= 64) return tsr_mma_attn_run<B, 64, 1, 64>(a, policy, stream);
  if (d <= 128) return tsr_mma_attn_run<B, 128, 1, 64>(a, policy, stream);
  if (d <= 256) return tsr_mma_attn_run<B, 256, 1, 32>(a, policy, stream);
  if (tsr_mma_wide(a))
    return tsr_mma_attn_run<B, 256, 2, 32, TSR_MMA_WIDE_WARPS>(a, policy, stream);
  return tsr_mma_attn_run<B, 256, 2, 32>(a, policy, stream);
}

#endif
