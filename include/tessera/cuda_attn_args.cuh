/*
** The arguments of the GPU's attention kernels (tessera/cuda_attn_tile.cuh and
** tessera/cuda_attn_mma.cuh) and the host-side choices made from them alone, apart
** from the kernels so that they compile, and are tested, on a machine without a GPU.
** Which staged query row a key is scored against, and a row's score gain, are the
** band policy's (tessera/cuda_attn_tile.cuh), a kernel argument of its own.
*/
#ifndef TESSERA_CUDA_ATTN_ARGS_CUH
#define TESSERA_CUDA_ATTN_ARGS_CUH

#include <stddef.h>
#include <stdint.h>

#include "tessera/attn_decode_fit.h"
#include "tessera/cuda_quant.cuh"

#define TSR_TILE_WARPS 4
#define TSR_TILE_K 32
#define TSR_TILE_MAX_D 512
#define TSR_TILE_MIN_KEYS_PER_SPLIT 256
/* The most bands a band policy has (tessera/cuda_attn_tile.cuh) */
#define TSR_TILE_MAX_BANDS 3

struct tsr_tile_args {
  /* query row (band b, query i, head h) at qb + i*q_row + h*q_head, qb q for band 0 and
  ** q_bands[b - 1] for the band policy's further bands (the same strides); f32 */
  const char *q, *q_bands[TSR_TILE_MAX_BANDS - 1];
  int64_t q_row, q_head, q_nb0;
  const char *k, *v; /* rows: j*nb1 + hk*nb2, element type k_type / v_type */
  int32_t k_type, v_type;
  int64_t k_nb0, k_nb1, k_nb2, v_nb0, v_nb1, v_nb2;
  const char *q_pos, *kv_pos; /* i32, stride nb0; q_pos NULL: queries at 0; kv_pos NULL:
                              ** no position checks (mask only) */
  int64_t q_pos_nb0, kv_pos_nb0;
  const char *mask; /* f32 or f16 [Nkv, Nq] or NULL */
  int32_t mask_f16;
  int64_t mask_nb0, mask_nb1;
  char *dst; /* f32 out: i*dst_row + h*dst_head + d*dst_nb0 */
  int64_t dst_row, dst_head, dst_nb0;
  int64_t D, Dv, Nq, Hq, Nkv, group;
  float scale, softcap;
  int32_t causal, window;
  int32_t pipelined; /* tensor-core kernel, opt-in until measured: the next tile's key
                     ** positions and K/V tiles loaded while this one is computed (where a
                     ** second set of buffers fits; else the V tile arriving during Q K^T
                     ** and the softmax), and a warp whose 16 rows hold no query skipping
                     ** the products (most of a decode tile's warps) */
  int32_t kv_double; /* set at launch: the pipelined loop's second buffers fit */
  int32_t raw_kv; /* set at launch (default loop): bit 0 K, bit 1 V copied whole into shared
                  ** memory as bytes, then decoded there (tsr_mma_copy_raw) */
  int32_t gqa_decode; /* one query's decode on the GQA decode kernel (tessera/cuda_attn_gqa.cuh)
                      ** where tsr_gqa_decode_fits; 2 (the backend's default): its staged
                      ** variant where tsr_gqa_staged; 0: the tile kernels */
  int32_t split_keys; /* the fewest keys a split takes; 0: TSR_TILE_MIN_KEYS_PER_SPLIT */
  int32_t f32;        /* f32 operands only (backend.precision f32): never the tensor-core
                      ** kernels (the prefill tiles' and the GQA decode kernel's f16) */
  int32_t max_splits; /* the most splits the caller's part buffer holds; 0: no bound */
  /* decode parameters (struct tsr_decode_params), acted on by the GQA decode kernel only:
  ** skip_below > 0 skips the V row of a key whose weight against the warp's running max is
  ** below it for every q head of the group, but for keys at positions below sink or within
  ** recent of the query; counters (device memory: struct tsr_decode_counters' four words)
  ** get the keys weighed and skipped, the rows and the softmax mass they dropped */
  float skip_below;
  int32_t sink, recent;
  unsigned long long *counters;
  /* set by tsr_tile_attn_plan */
  int32_t mma, qpw, splits; /* mma: the tensor-core kernel (tessera/cuda_attn_mma.cuh) */
  int64_t per_split;
  float *part; /* splits > 1: [Nq * Hq][splits][Dv + 2] partial states, the caller's, then
               ** with skip_below [Nq * Hq][splits] the skipped weights' sums (tsr_tile_skip_part) */
};

/* Where the splits' sums of skipped weights follow the partial states. */
__host__ __device__ static inline float *tsr_tile_skip_part(const struct tsr_tile_args &a) {
  return a.part + a.Nq * a.Hq * (int64_t)a.splits * (a.Dv + 2);
}

/* Where band b's query rows start. */
__host__ __device__ static inline const char *tsr_tile_q_of(const struct tsr_tile_args &a, int b) {
  return b == 0 ? a.q : a.q_bands[b - 1];
}

/* Shared bytes of one tensor's raw tile: tk rows of nb1 bytes from a start up to 15 bytes
** past a 16-byte boundary, rounded to 16 (the next tensor's copy starts aligned). */
__host__ __device__ static inline size_t tsr_mma_raw_span(int tk, int64_t nb1) {
  return ((size_t)tk * (size_t)nb1 + 15 + 15) / 16 * 16;
}

/* Bytes of shared memory the default loop's raw copies take (0: none), setting a->raw_kv:
** q8_0 and q4_0 K or V whose rows lie end to end (a tile is one span of bytes) in a buffer
** 16-byte aligned, so the span's aligned start is inside it. */
static inline size_t tsr_mma_raw_bytes(struct tsr_tile_args *a, int tk) {
  auto span = [&](int32_t type, int64_t d, int64_t nb1, int64_t nb2, const char *base) -> size_t {
    if (type != T_Q8_0 && type != T_Q4_0) return 0;
    if (d % 32 || nb1 != d / 32 * cu_block_bytes(type) || nb2 % 2 || ((uintptr_t)base & 15))
      return 0;
    return tsr_mma_raw_span(tk, nb1);
  };
  const size_t k = span(a->k_type, a->D, a->k_nb1, a->k_nb2, a->k);
  const size_t v = span(a->v_type, a->Dv, a->v_nb1, a->v_nb2, a->v);
  a->raw_kv = (k ? 1 : 0) | (v ? 2 : 0);
  return k + v;
}

/* Whether a launch takes the GQA decode kernel (tessera/cuda_attn_gqa.cuh): asked for,
** one query, a shape and K/V pair it compiles (tsr_gqa_decode_shape_fits), f16 rows
** contiguous and 4-byte aligned, q8_0 and q4_0 2-byte aligned (it loads a pair of values
** at a time). */
static inline bool tsr_gqa_decode_fits(const struct tsr_tile_args *a) {
  auto aligned = [](int32_t type, int64_t nb0, int64_t nb1, int64_t nb2, const char *p) {
    const uintptr_t at = (uintptr_t)p;
    if (type == T_F16) return nb0 == 2 && nb1 % 4 == 0 && nb2 % 4 == 0 && at % 4 == 0;
    return nb1 % 2 == 0 && nb2 % 2 == 0 && at % 2 == 0;
  };
  static_assert((int)T_F16 == (int)TSR_DTYPE_ID_F16 && (int)T_Q8_0 == (int)TSR_DTYPE_ID_Q8_0 &&
                    (int)T_Q4_0 == (int)TSR_DTYPE_ID_Q4_0,
                "the kernels' type ids are the dtype ids");
  return a->gqa_decode && a->Nq == 1 &&
         tsr_gqa_decode_shape_fits(a->group, a->D, a->Dv, a->k_type, a->v_type) &&
         aligned(a->k_type, a->k_nb0, a->k_nb1, a->k_nb2, a->k) &&
         aligned(a->v_type, a->v_nb0, a->v_nb1, a->v_nb2, a->v);
}

/* Whether a GQA decode launch may take the staged variant: asked for (gqa_decode 2), K and V
** in q8_0 or q4_0 with rows end to end (a step's rows are one span of bytes, nothing between
** them copied) starting 16-byte aligned, so a step's aligned first chunk lies inside the
** buffer (the tile kernels' raw copies ask the same, tsr_mma_raw_bytes). f16 stays unstaged:
** rows of a multiple of 128 bytes would put a fragment's 8 rows in one shared-memory bank.
** The launch also needs two steps a warp to fit a block's shared memory. */
static inline bool tsr_gqa_staged(const struct tsr_tile_args *a) {
  auto rows = [](int32_t type, int64_t d, int64_t nb1, const char *p) {
    return (type == T_Q8_0 || type == T_Q4_0) && nb1 == d / 32 * cu_block_bytes(type) &&
           !((uintptr_t)p & 15);
  };
  return a->gqa_decode == 2 && rows(a->k_type, a->D, a->k_nb1, a->k) &&
         rows(a->v_type, a->Dv, a->v_nb1, a->v);
}

/* Warps a block of the wide variant of the tensor-core kernel (tsr_mma_wide). */
#define TSR_MMA_WIDE_WARPS 8

/* Whether a launch takes the wide variant: head dims past 256 (two warps a 16 rows) with a
** q8_0 or q4_0 K or V copied whole (tsr_mma_raw_bytes), default loop, and more rows than a
** block of 4 warps holds (a decode step's few rows keep two such blocks a multiprocessor,
** its keys split over 2 n_sm of them). Its 64 rows a block share each decoded tile, where
** blocks of 4 warps and 32 rows decode every key twice as often; and one block of 8 warps a
** multiprocessor (what 251 registers a thread allow) has the room for the raw copies that
** two blocks of 4 warps lack (decoding from global memory, the D 512 q8_0/q4_0 prefill ran
** at 28.5 TFLOP/s against f16's 76). */
static inline bool tsr_mma_wide(const struct tsr_tile_args *a) {
  if (a->pipelined || (a->D > a->Dv ? a->D : a->Dv) <= 256 ||
      a->Nq * a->group <= TSR_TILE_WARPS / 2 * 16)
    return false;
  struct tsr_tile_args t = *a;
  return tsr_mma_raw_bytes(&t, TSR_TILE_K) > 0;
}

#endif
