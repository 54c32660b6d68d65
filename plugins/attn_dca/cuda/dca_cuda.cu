/*
** attn_dca's kernels on the cuda backend (attn_dca_cuda.so, opened by the
** host only when a cuda run checks a graph holding them; the plugin's own .so
** links no CUDA). Semantics are dca_cpu.c's; the calling convention is
** include/tessera/plugin_cuda.h's.
**
** dca_attention_cuda runs prefill (16 queries or more, head dims up to 256)
** through the tiled kernel the core's flash uses too (tessera/cuda_attn_tile.cuh,
** three bands). Otherwise it is the core's split-KV flash kernel
** (core/cuda/kernels_attn.cu) with the band choice added: a block of four warps takes one (query, q head)
** and a range of keys, each warp walks every fourth key with its own running
** max, sum and accumulator, and the warps merge at the end; decode splits the
** keys over several blocks whose partial states a second kernel merges. Each
** visible key picks the query rotation of its band from its absolute position
** (analytic bounds: no mask tensor, no per-band pass), so the three bands
** share one online softmax, an empty band adds nothing and a row without keys
** is zeros. K and V are read in place in every scalar KV dtype (dq_rt,
** include/tessera/cuda_quant.cuh): a step never converts the cache. With every
** key in the intra band either path does flash's arithmetic in flash's order,
** so a context of one chunk equals the cuda flash kernel bit for bit.
*/
#include <cuda_runtime.h>
#include <math.h>

#include "../dca.h"
#include "tessera/cuda_attn_tile.cuh"
#include "tessera/cuda_quant.cuh"
#include "tessera/plugin_cuda.h"

#define DCA_WARPS 4
#define DCA_MAX_D 512
#define DCA_REG (DCA_MAX_D / 32)
#define DCA_MIN_KEYS_PER_SPLIT 256
#define DCA_TILE_MIN_QUERIES 16 /* prefill: the shared tiled kernel; fewer: split-KV below */

/* A tensor as the kernels read it: device address, dtype, sizes, byte strides. */
struct ten {
  const char *p;
  int32_t type;
  int64_t ne[4], nb[4];
};

static ten ten_of(const struct tsr_tensor_info *t) {
  ten r = {(const char *)t->data, t->dtype, {0, 0, 0, 0}, {0, 0, 0, 0}};
  for (int k = 0; k < 4; k++) r.ne[k] = t->ne[k], r.nb[k] = (int64_t)t->nb[k];
  return r;
}

struct shape {
  int64_t D, Dv, Nq, Hq, Nkv, group;
  int splits;
  int64_t per_split;
  int32_t c, temp_from;
  float scale, softcap;
  int mask_f16;
};

/* Splits of the keys: enough blocks to fill the GPU, at least 256 keys each. */
static void plan_splits(shape *s, int n_sm) {
  const int64_t units = s->Nq * s->Hq, want = 4 * (int64_t)(n_sm > 0 ? n_sm : 132);
  int64_t splits = (want + units - 1) / units;
  const int64_t most = (s->Nkv + DCA_MIN_KEYS_PER_SPLIT - 1) / DCA_MIN_KEYS_PER_SPLIT;
  if (splits > most) splits = most;
  if (splits < 1) splits = 1;
  s->per_split = (s->Nkv + splits - 1) / splits;
  s->splits = (int)((s->Nkv + s->per_split - 1) / s->per_split);
  if (s->splits < 1) s->splits = 1;
}

__device__ static inline int32_t pos_at(const ten &t, int64_t i) {
  return *reinterpret_cast<const int32_t *>(t.p + i * t.nb[0]);
}

/* dca_logit_gain in the same float/double steps */
__device__ static inline float logit_gain(int32_t p, int32_t from) {
  if (from <= 0 || (int64_t)p + 1 <= from) return 1.0f;
  const double f = 0.1 * log(((double)p + 1.0) / (double)from) + 1.0;
  return (float)(f * f);
}

/* q3 [D, Hq, 3 Nq] (band b of query iq at token b Nq + iq), k/v [D, Nkv, Hkv],
** q_pos [Nq], kv_pos [Nkv], mask [Nkv, Nq] or absent; dst [Dv, Hq, Nq]. */
__global__ void __launch_bounds__(32 * DCA_WARPS)
k_dca_attn(ten dst, ten q3, ten k, ten v, ten q_pos, ten kv_pos, ten mask, shape s, float *part) {
  __shared__ float q_s[3][DCA_MAX_D];
  __shared__ float acc_s[DCA_WARPS][DCA_MAX_D];
  __shared__ float m_s[DCA_WARPS], l_s[DCA_WARPS];
  const int64_t unit = blockIdx.x, iq = unit / s.Hq, h = unit % s.Hq, hk = h / s.group;
  const int split = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  for (int b = 0; b < 3; b++) {
    const char *qrow = q3.p + (b * s.Nq + iq) * q3.nb[2] + h * q3.nb[1];
    for (int64_t d = threadIdx.x; d < s.D; d += blockDim.x)
      q_s[b][d] = *reinterpret_cast<const float *>(qrow + d * q3.nb[0]);
  }
  __syncthreads();

  const int64_t j0 = split * s.per_split;
  const int64_t j1 = j0 + s.per_split < s.Nkv ? j0 + s.per_split : s.Nkv;
  const int32_t qp = pos_at(q_pos, iq);
  const int64_t lo_intra = (int64_t)qp / s.c * s.c, lo_succ = lo_intra - s.c;
  const float gain = logit_gain(qp, s.temp_from);
  const char *kbase = k.p + hk * k.nb[2], *vbase = v.p + hk * v.nb[2];
  const char *mrow = mask.p ? mask.p + iq * mask.nb[1] : NULL;

  float m = -INFINITY, l = 0.0f, acc[DCA_REG];
#pragma unroll
  for (int i = 0; i < DCA_REG; i++) acc[i] = 0.0f;

  for (int64_t j = j0 + warp; j < j1; j += DCA_WARPS) {
    float bias = 0.0f;
    if (mrow) {
      const char *p = mrow + j * mask.nb[0];
      bias = s.mask_f16 ? __half2float(*reinterpret_cast<const __half *>(p))
                        : *reinterpret_cast<const float *>(p);
    }
    const int32_t kp = pos_at(kv_pos, j);
    if (kp < 0 || kp > qp) bias = -INFINITY; /* an empty cell, or the future */
    if (bias == -INFINITY) continue;        /* the same for every lane: no divergence */
    const float *q = q_s[kp >= lo_intra ? 0 : kp >= lo_succ ? 1 : 2];
    const char *krow = kbase + j * k.nb[1];
    float dot = 0.0f;
    for (int64_t d = lane; d < s.D; d += 32) dot += q[d] * dq_rt(k.type, krow, d, k.nb[0]);
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    dot = __shfl_sync(0xffffffffu, dot, 0); /* lanes summed in different orders: agree on one */
    float x = dot * s.scale;
    if (gain != 1.0f) x *= gain;
    if (s.softcap > 0.0f) x = s.softcap * tanhf(x / s.softcap);
    x += bias;
    if (x == -INFINITY) continue;
    if (x > m) {
      const float f = m == -INFINITY ? 0.0f : expf(m - x);
      l *= f;
#pragma unroll
      for (int i = 0; i < DCA_REG; i++) acc[i] *= f;
      m = x;
    }
    const float p = expf(x - m);
    l += p;
    if (p == 0.0f) continue; /* underflowed: the V row (and any inf in it) is not read */
    const char *vrow = vbase + j * v.nb[1];
#pragma unroll
    for (int i = 0; i < DCA_REG; i++) {
      const int64_t d = lane + 32 * i;
      if (d < s.Dv) acc[i] += p * dq_rt(v.type, vrow, d, v.nb[0]);
    }
  }

  if (lane == 0) m_s[warp] = m, l_s[warp] = l;
#pragma unroll
  for (int i = 0; i < DCA_REG; i++)
    if (lane + 32 * i < s.Dv) acc_s[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < DCA_WARPS; w++) M = fmaxf(M, m_s[w]);
  float f[DCA_WARPS], L = 0.0f;
  for (int w = 0; w < DCA_WARPS; w++) {
    f[w] = m_s[w] == -INFINITY ? 0.0f : expf(m_s[w] - M);
    L += l_s[w] * f[w];
  }
  float *prow = part + (unit * s.splits + split) * (s.Dv + 2);
  for (int64_t d = threadIdx.x; d < s.Dv; d += blockDim.x) {
    float val = 0.0f;
    for (int w = 0; w < DCA_WARPS; w++) val += acc_s[w][d] * f[w];
    if (s.splits == 1) {
      const float inv = L > 0.0f ? 1.0f / L : 0.0f; /* no key: zeros */
      *reinterpret_cast<float *>(const_cast<char *>(dst.p) + h * dst.nb[1] + iq * dst.nb[2] +
                                 d * dst.nb[0]) = val * inv;
    } else {
      prow[2 + d] = val;
    }
  }
  if (s.splits > 1 && threadIdx.x == 0) prow[0] = M, prow[1] = L;
}

/* Merges the splits' partial states of one (query, head). */
__global__ void k_dca_combine(ten dst, shape s, const float *part) {
  const int64_t unit = blockIdx.x, iq = unit / s.Hq, h = unit % s.Hq;
  const float *pp = part + unit * s.splits * (s.Dv + 2);
  float M = -INFINITY;
  for (int i = 0; i < s.splits; i++) M = fmaxf(M, pp[i * (s.Dv + 2)]);
  float L = 0.0f;
  for (int i = 0; i < s.splits; i++) {
    const float mi = pp[i * (s.Dv + 2)];
    if (mi != -INFINITY) L += pp[i * (s.Dv + 2) + 1] * expf(mi - M);
  }
  const float inv = L > 0.0f ? 1.0f / L : 0.0f;
  for (int64_t d = threadIdx.x; d < s.Dv; d += blockDim.x) {
    float val = 0.0f;
    for (int i = 0; i < s.splits; i++) {
      const float mi = pp[i * (s.Dv + 2)];
      if (mi != -INFINITY) val += pp[i * (s.Dv + 2) + 2 + d] * expf(mi - M);
    }
    *reinterpret_cast<float *>(const_cast<char *>(dst.p) + h * dst.nb[1] + iq * dst.nb[2] +
                               d * dst.nb[0]) = val * inv;
  }
}

__global__ void k_dca_positions(int32_t *out, ten pos, int64_t n, int32_t mode, int32_t c,
                                int32_t cs, int32_t delta) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int32_t p = pos_at(pos, i);
  int32_t r = p % c;
  if (r < 0) r += c;
  if (mode == DCA_POS_KEY) {
    out[i] = r;
  } else if (mode == DCA_POS_SHIFT) {
    int32_t moved = (int32_t)(((int64_t)p + delta) % c);
    if (moved < 0) moved += c;
    out[i] = moved - r;
  } else {
    const int64_t succ = (int64_t)r + c, inter = 2 * (int64_t)c - 1;
    out[i] = r;
    out[n + i] = (int32_t)(succ < cs ? succ : cs);
    out[2 * n + i] = (int32_t)(inter < cs ? inter : cs);
  }
}

static int sm_count(int device) {
  static int cached = -1, cached_device = -1;
  if (cached < 0 || cached_device != device) {
    if (cudaDeviceGetAttribute(&cached, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
      cached = 132;
    cached_device = device;
  }
  return cached;
}

/* What a node served; queries past the first chunk are counted on the cpu
** only, since their positions lie on the device. */
static void count(const int32_t *params, int64_t n_queries) {
  const struct dca_state *st = (const struct dca_state *)dca_get_ptr(params, DCA_P_STATE);
  if (!st) return;
  st->host->engaged(st->self, "layers_served", 1);
  st->host->engaged(st->self, "tokens_served", (uint64_t)n_queries);
}

/* Prefill through the shared tiled kernel (tessera/cuda_attn_tile.cuh) with
** three bands; false when the head dims are past it. */
static bool tiled(const struct tsr_tensor_info *dst, const struct tsr_tensor_info *src,
                  bool has_mask, const shape &s, cudaStream_t stream) {
  const ten q3 = ten_of(&src[0]), k = ten_of(&src[1]), v = ten_of(&src[2]);
  const ten qp = ten_of(&src[3]), kp = ten_of(&src[4]), out = ten_of(dst);
  tsr_tile_args t = {};
  t.q = q3.p, t.q_band = s.Nq * q3.nb[2], t.q_row = q3.nb[2], t.q_head = q3.nb[1];
  t.q_nb0 = q3.nb[0];
  t.k = k.p, t.k_type = k.type, t.k_nb0 = k.nb[0], t.k_nb1 = k.nb[1], t.k_nb2 = k.nb[2];
  t.v = v.p, t.v_type = v.type, t.v_nb0 = v.nb[0], t.v_nb1 = v.nb[1], t.v_nb2 = v.nb[2];
  t.q_pos = qp.p, t.q_pos_nb0 = qp.nb[0], t.kv_pos = kp.p, t.kv_pos_nb0 = kp.nb[0];
  if (has_mask) {
    const ten mk = ten_of(&src[5]);
    t.mask = mk.p, t.mask_f16 = s.mask_f16, t.mask_nb0 = mk.nb[0], t.mask_nb1 = mk.nb[1];
  }
  t.dst = const_cast<char *>(out.p), t.dst_row = out.nb[2], t.dst_head = out.nb[1];
  t.dst_nb0 = out.nb[0];
  t.D = s.D, t.Dv = s.Dv, t.Nq = s.Nq, t.Hq = s.Hq, t.Nkv = s.Nkv, t.group = s.group;
  t.scale = s.scale, t.softcap = s.softcap, t.causal = 1;
  t.n_bands = 3, t.c = s.c, t.temp_from = s.temp_from;
  return tsr_tile_attn_launch(&t, stream) == cudaSuccess;
}

extern "C" TSR_PLUGIN_EXPORT void
dca_positions_cuda(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                   const struct tsr_tensor_info *src, int n_src, const int32_t *params) {
  (void)ith, (void)nth, (void)n_src;
  struct tsr_device_call *call = tsr_cuda_call_begin(ctx);
  const int64_t n = src[0].ne[0];
  if (n > 0)
    k_dca_positions<<<(unsigned)((n + 255) / 256), 256, 0, tsr_cuda_call_stream(call)>>>(
        (int32_t *)dst->data, ten_of(&src[0]), n, params[0], params[1], params[2], params[3]);
  tsr_cuda_call_finish(ctx, call, "attn_dca positions");
}

extern "C" TSR_PLUGIN_EXPORT void
dca_attention_cuda(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                   const struct tsr_tensor_info *src, int n_src, const int32_t *params) {
  (void)ith, (void)nth;
  const struct tsr_host *host = (const struct tsr_host *)ctx;
  struct tsr_device_call *call = tsr_cuda_call_begin(ctx);
  const cudaStream_t stream = tsr_cuda_call_stream(call);
  const bool has_mask = params[DCA_P_MASK] && n_src > 5;
  shape s;
  s.D = src[0].ne[0];
  s.Hq = src[0].ne[1];
  s.Nq = src[0].ne[2] / 3;
  s.Dv = src[2].ne[0];
  s.Nkv = src[1].ne[1];
  s.group = s.Hq / src[1].ne[2];
  s.c = params[DCA_P_C];
  s.temp_from = params[DCA_P_TEMP];
  memcpy(&s.scale, &params[DCA_P_SCALE], sizeof s.scale);
  memcpy(&s.softcap, &params[DCA_P_SOFTCAP], sizeof s.softcap);
  s.mask_f16 = has_mask && src[5].dtype == T_F16;
  if (s.D > DCA_MAX_D || s.Dv > DCA_MAX_D) {
    if (call)
      call->status = host->set_error(TSR_ERR_UNSUPPORTED, "attn_dca on cuda: head dims %lld/%lld "
                                     "past %d", (long long)s.D, (long long)s.Dv, DCA_MAX_D);
    return;
  }
  if (s.Nq == 0) return;
  if (s.Nq >= DCA_TILE_MIN_QUERIES && tiled(dst, src, has_mask, s, stream)) {
    tsr_cuda_call_finish(ctx, call, "attn_dca attention (tiled)");
    count(params, s.Nq);
    return;
  }
  plan_splits(&s, sm_count(call ? call->device : 0));
  float *part = NULL;
  if (s.splits > 1) {
    const size_t bytes = (size_t)(s.Nq * s.Hq) * (size_t)s.splits * (size_t)(s.Dv + 2) * 4;
    const cudaError_t e = cudaMallocAsync((void **)&part, bytes, stream);
    if (e != cudaSuccess) {
      if (call)
        call->status = host->set_error(TSR_ERR_NOMEM, "attn_dca on cuda: %zu bytes of split "
                                       "scratch: %s", bytes, cudaGetErrorString(e));
      return;
    }
  }
  const ten none = {NULL, 0, {0, 0, 0, 0}, {0, 0, 0, 0}};
  const dim3 grid((unsigned)(s.Nq * s.Hq), (unsigned)s.splits);
  k_dca_attn<<<grid, 32 * DCA_WARPS, 0, stream>>>(
      ten_of(dst), ten_of(&src[0]), ten_of(&src[1]), ten_of(&src[2]), ten_of(&src[3]),
      ten_of(&src[4]), has_mask ? ten_of(&src[5]) : none, s, part);
  if (part) {
    k_dca_combine<<<(unsigned)(s.Nq * s.Hq), 128, 0, stream>>>(ten_of(dst), s, part);
    cudaFreeAsync(part, stream);
  }
  tsr_cuda_call_finish(ctx, call, "attn_dca attention");
  count(params, s.Nq);
}
