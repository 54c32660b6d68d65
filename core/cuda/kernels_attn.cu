/*
** Built-in attention `flash` on the GPU, with core/cpu/ops_attention.c's
** semantics: streaming softmax over the keys, never a logit matrix; K and V
** each in their own dtype (f32, f16, bf16, q8_0, q6_0, q5_1, q5_0, q4_1,
** q4_0), decoded element by element as they are read; additive mask,
** positions (negative kv_pos = empty cell, causal, sliding window), softcap
** before the mask; a query that sees no key gives zeros.
**
** Prefill and decode go through the shared kernels of tessera/cuda_attn_tile.cuh
** (K/V tiles staged once per block of rows of one KV head's group, keys split
** over blocks when rows are few; tensor cores for head dims in steps of 16,
** tessera/cuda_attn_mma.cuh) with one band (tsr_one_band: one query row a key,
** no gain). Where positions are not one strided run
** (or that kernel cannot launch), a block of four warps takes one (query, q
** head) and a range of the keys; each warp walks every fourth key of the range with its own running max,
** sum and accumulator (lanes hold head dims lane, lane+32, ...), the warps
** merge in shared memory at the end. When queries x heads are too few to
** fill the GPU (decode), the keys are split over several blocks whose
** partial (max, sum, accumulator) a second kernel merges. Head dims up to
** CU_ATTN_MAX_D; the dtype is a uniform runtime branch, so one kernel serves
** every K x V pair without an instantiation per pair.
*/
#include <cuda_runtime.h>
#include <math.h>

#include "cuda_kernels.h"
#include "tessera/cuda_attn_tile.cuh"
#include "tessera/cuda_quant.cuh"

#define FA_WARPS 4
#define FA_REG (CU_ATTN_MAX_D / 32)
#define FA_MIN_KEYS_PER_SPLIT 256

struct fa_shape {
  int64_t D, Dv, Nq, Hq, Nkv, group;
  int64_t qps, kvps; /* single stride of a position tensor, or 0: general lookup */
  int splits;
  int64_t per_split;
};

/* A position tensor holds N i32 in any shape; usually one run with one stride. */
static int64_t pos_stride(const cu_t *t) {
  if (!t->p) return 0;
  int runs = 0;
  int64_t stride = t->nb[0];
  for (int d = 0; d < 4; d++)
    if (t->ne[d] > 1) runs++, stride = t->nb[d];
  return runs <= 1 ? stride : 0;
}

__device__ static inline int32_t pos_at(const cu_t &t, int64_t stride, int64_t i) {
  if (stride) return *reinterpret_cast<const int32_t *>(t.p + i * stride);
  int64_t off = 0;
  for (int d = 0; d < 4; d++) {
    off += (i % t.ne[d]) * t.nb[d];
    i /= t.ne[d];
  }
  return *reinterpret_cast<const int32_t *>(t.p + off);
}

static void fa_plan(const cu_t *dst, const cu_attn *a, int n_sm, fa_shape *s) {
  s->D = a->q.ne[0];
  s->Dv = a->v.ne[0];
  s->Nq = a->q.ne[1];
  s->Hq = a->q.ne[2];
  s->Nkv = a->k.ne[1];
  s->group = a->q.ne[2] / a->k.ne[2];
  s->qps = pos_stride(&a->q_pos);
  s->kvps = pos_stride(&a->kv_pos);
  const int64_t units = s->Nq * s->Hq, want = 4 * (int64_t)(n_sm > 0 ? n_sm : 132);
  int64_t splits = (want + units - 1) / units;
  const int64_t most = (s->Nkv + FA_MIN_KEYS_PER_SPLIT - 1) / FA_MIN_KEYS_PER_SPLIT;
  if (splits > most) splits = most;
  if (splits < 1) splits = 1;
  s->per_split = (s->Nkv + splits - 1) / splits;
  s->splits = (int)((s->Nkv + s->per_split - 1) / s->per_split);
  if (s->splits < 1) s->splits = 1;
  (void)dst;
}

__global__ void __launch_bounds__(32 * FA_WARPS)
k_flash_attn(cu_t dst, cu_attn a, fa_shape s, float *part) {
  __shared__ float q_s[CU_ATTN_MAX_D];
  __shared__ float acc_s[FA_WARPS][CU_ATTN_MAX_D];
  __shared__ float m_s[FA_WARPS], l_s[FA_WARPS];
  const int64_t unit = blockIdx.x, iq = unit / s.Hq, h = unit % s.Hq, hk = h / s.group;
  const int split = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  const char *qrow = a.q.p + iq * a.q.nb[1] + h * a.q.nb[2];
  for (int64_t d = threadIdx.x; d < s.D; d += blockDim.x)
    q_s[d] = *reinterpret_cast<const float *>(qrow + d * a.q.nb[0]);
  __syncthreads();

  const int64_t j0 = split * s.per_split;
  const int64_t j1 = j0 + s.per_split < s.Nkv ? j0 + s.per_split : s.Nkv;
  const int32_t qp = a.q_pos.p ? pos_at(a.q_pos, s.qps, iq) : 0;
  const char *kbase = a.k.p + hk * a.k.nb[2], *vbase = a.v.p + hk * a.v.nb[2];
  const char *mrow = a.mask.p ? a.mask.p + iq * a.mask.nb[1] : NULL;
  const bool mask_f16 = a.mask.type == T_F16;

  float m = -INFINITY, l = 0.0f, acc[FA_REG];
#pragma unroll
  for (int i = 0; i < FA_REG; i++) acc[i] = 0.0f;

  for (int64_t j = j0 + warp; j < j1; j += FA_WARPS) {
    float bias = 0.0f;
    if (mrow) {
      const char *p = mrow + j * a.mask.nb[0];
      bias = mask_f16 ? __half2float(*reinterpret_cast<const __half *>(p))
                      : *reinterpret_cast<const float *>(p);
    }
    if (a.kv_pos.p) {
      const int32_t kp = pos_at(a.kv_pos, s.kvps, j);
      if (kp < 0 || (a.causal && kp > qp) || (a.window > 0 && (int64_t)qp - kp >= a.window))
        bias = -INFINITY;
    }
    if (bias == -INFINITY) continue; /* the same for every lane: no divergence */
    const char *krow = kbase + j * a.k.nb[1];
    float dot = 0.0f;
    for (int64_t d = lane; d < s.D; d += 32) dot += q_s[d] * dq_rt(a.k.type, krow, d, a.k.nb[0]);
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    dot = __shfl_sync(0xffffffffu, dot, 0); /* lanes summed in different orders: agree on one */
    float x = dot * a.scale;
    if (a.softcap > 0.0f) x = a.softcap * tanhf(x / a.softcap);
    x += bias;
    if (x == -INFINITY) continue;
    if (x > m) {
      const float f = m == -INFINITY ? 0.0f : expf(m - x);
      l *= f;
#pragma unroll
      for (int i = 0; i < FA_REG; i++) acc[i] *= f;
      m = x;
    }
    const float p = expf(x - m);
    l += p;
    if (p == 0.0f) continue; /* underflowed: the V row (and any inf in it) is not read */
    const char *vrow = vbase + j * a.v.nb[1];
#pragma unroll
    for (int i = 0; i < FA_REG; i++) {
      const int64_t d = lane + 32 * i;
      if (d < s.Dv) acc[i] += p * dq_rt(a.v.type, vrow, d, a.v.nb[0]);
    }
  }

  if (lane == 0) m_s[warp] = m, l_s[warp] = l;
#pragma unroll
  for (int i = 0; i < FA_REG; i++)
    if (lane + 32 * i < s.Dv) acc_s[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < FA_WARPS; w++) M = fmaxf(M, m_s[w]);
  float f[FA_WARPS], L = 0.0f;
  for (int w = 0; w < FA_WARPS; w++) {
    f[w] = m_s[w] == -INFINITY ? 0.0f : expf(m_s[w] - M);
    L += l_s[w] * f[w];
  }
  for (int64_t d = threadIdx.x; d < s.Dv; d += blockDim.x) {
    float v = 0.0f;
    for (int w = 0; w < FA_WARPS; w++) v += acc_s[w][d] * f[w];
    if (s.splits == 1) {
      const float inv = L > 0.0f ? 1.0f / L : 0.0f;
      *reinterpret_cast<float *>(dst.p + h * dst.nb[1] + iq * dst.nb[2] + d * dst.nb[0]) = v * inv;
    } else {
      part[(unit * s.splits + split) * (s.Dv + 2) + 2 + d] = v;
    }
  }
  if (s.splits > 1 && threadIdx.x == 0) {
    part[(unit * s.splits + split) * (s.Dv + 2)] = M;
    part[(unit * s.splits + split) * (s.Dv + 2) + 1] = L;
  }
}

/* The shared tiled kernel's arguments (tessera/cuda_attn_tile.cuh), planned;
** false when it does not apply (positions not one strided run). */
static bool tile_args(const cu_t *dst, const cu_attn *a, const fa_shape &s, int n_sm,
                      tsr_tile_args *t, size_t *part_bytes) {
  if (s.D > TSR_TILE_MAX_D || s.Dv > TSR_TILE_MAX_D || (a->q_pos.p && !s.qps) ||
      (a->kv_pos.p && !s.kvps))
    return false;
  *t = tsr_tile_args{};
  t->q = a->q.p, t->q_row = a->q.nb[1], t->q_head = a->q.nb[2], t->q_nb0 = a->q.nb[0];
  t->k = a->k.p, t->k_type = a->k.type, t->k_nb0 = a->k.nb[0], t->k_nb1 = a->k.nb[1];
  t->k_nb2 = a->k.nb[2];
  t->v = a->v.p, t->v_type = a->v.type, t->v_nb0 = a->v.nb[0], t->v_nb1 = a->v.nb[1];
  t->v_nb2 = a->v.nb[2];
  t->q_pos = a->q_pos.p, t->q_pos_nb0 = s.qps, t->kv_pos = a->kv_pos.p, t->kv_pos_nb0 = s.kvps;
  t->mask = a->mask.p, t->mask_f16 = a->mask.type == T_F16, t->mask_nb0 = a->mask.nb[0];
  t->mask_nb1 = a->mask.nb[1];
  t->dst = dst->p, t->dst_row = dst->nb[2], t->dst_head = dst->nb[1], t->dst_nb0 = dst->nb[0];
  t->D = s.D, t->Dv = s.Dv, t->Nq = s.Nq, t->Hq = s.Hq, t->Nkv = s.Nkv, t->group = s.group;
  t->scale = a->scale, t->softcap = a->softcap, t->causal = a->causal, t->window = a->window;
  t->pipelined = a->pipelined, t->split_keys = a->split_keys;
  t->gqa_decode = a->gqa_decode;
  t->f32 = a->f32;
  t->skip_below = a->skip_below, t->sink = a->sink, t->recent = a->recent;
  t->counters = a->counters;
  *part_bytes = tsr_tile_attn_plan(t, n_sm);
  return true;
}

/* Scratch for the tiled kernel's split partials, or, where it does not apply or
** cannot launch, for the per-query kernel's: enough for either. */
extern "C" size_t cu_flash_attn_scratch(const cu_t *dst, const cu_attn *a, int n_sm) {
  fa_shape s;
  fa_plan(dst, a, n_sm, &s);
  const size_t own = s.splits == 1 ? 0
                                   : (size_t)(s.Nq * s.Hq) * (size_t)s.splits *
                                         (size_t)(s.Dv + 2) * sizeof(float);
  tsr_tile_args t;
  size_t tiled = 0;
  if (!tile_args(dst, a, s, n_sm, &t, &tiled)) tiled = 0;
  return own > tiled ? own : tiled;
}

extern "C" int cu_flash_attn(cu_stream st, const cu_t *dst, const cu_attn *a, void *scratch,
                             int n_sm, int *tiled_refused) {
  fa_shape s;
  fa_plan(dst, a, n_sm, &s);
  *tiled_refused = 0;
  if (s.D > CU_ATTN_MAX_D || s.Dv > CU_ATTN_MAX_D) return (int)cudaErrorInvalidValue;
  tsr_tile_args t;
  size_t part = 0;
  if (tile_args(dst, a, s, n_sm, &t, &part)) {
    t.part = (float *)scratch;
    const cudaError_t e = tsr_tile_attn_launch(&t, tsr_one_band{}, (cudaStream_t)st);
    if (e == cudaSuccess) return (int)cudaSuccess;
    *tiled_refused = (int)e;
  } else if (a->skip_below > 0.0f) {
    *tiled_refused = (int)cudaErrorNotSupported;
  }
  if (a->skip_below > 0.0f) return (int)cudaSuccess; /* the caller refuses: no V skipping here */
  const dim3 grid((unsigned)(s.Nq * s.Hq), (unsigned)s.splits);
  k_flash_attn<<<grid, 32 * FA_WARPS, 0, st>>>(*dst, *a, s, (float *)scratch);
  if (s.splits > 1) { /* the partials have tsr_tile_combine's layout */
    tsr_tile_args c = {};
    c.dst = dst->p, c.dst_row = dst->nb[2], c.dst_head = dst->nb[1], c.dst_nb0 = dst->nb[0];
    c.Nq = s.Nq, c.Hq = s.Hq, c.Dv = s.Dv, c.splits = s.splits, c.part = (float *)scratch;
    tsr_tile_combine<<<(unsigned)(s.Nq * s.Hq), 128, 0, st>>>(c);
  }
  return (int)cudaGetLastError();
}
