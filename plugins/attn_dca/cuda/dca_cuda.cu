/*
** attn_dca's kernels on the cuda backend (attn_dca_cuda.so, opened by the
** host only when a cuda run checks a graph holding them; the plugin's own .so
** links no CUDA). Semantics are dca_cpu.c's; the calling convention is
** include/tessera/plugin_cuda.h's.
**
** dca_attention_cuda runs the kernels the core's flash uses too
** (tessera/cuda_attn_tile.cuh; tensor cores, tessera/cuda_attn_mma.cuh, for
** head dims in steps of 16) with DCA's band policy (dca_bands.cuh), for
** prefill and decode: each visible key takes the query rotation of its band
** from its absolute position (analytic bounds: no mask tensor; the tensor-core
** kernel runs one product per band present in a tile), so the three bands
** share one online softmax, an empty band adds nothing and a row without keys
** is zeros. K and V are read in place in every scalar KV dtype
** (tessera/cuda_quant.cuh): a step never converts the cache. With every key in
** the intra band it does flash's arithmetic in flash's order, so a context of
** one chunk equals the cuda flash kernel bit for bit. Split-KV partials live
** in rows planned past the output's queries (dca.h, dca_split_rows): a launch
** allocates nothing.
*/
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

#include "../dca.h"
#include "dca_bands.cuh"
#include "tessera/cuda_attn_tile.cuh"
#include "tessera/cuda_quant.cuh"
#include "tessera/plugin_cuda.h"

#define DCA_MAX_D TSR_TILE_MAX_D

/* A tensor as the kernels read it: device address, dtype, byte strides. */
struct ten {
  const char *p;
  int32_t type;
  int64_t nb[4];
};

static ten ten_of(const struct tsr_tensor_info *t) {
  ten r = {(const char *)t->data, t->dtype, {0, 0, 0, 0}};
  for (int k = 0; k < 4; k++) r.nb[k] = (int64_t)t->nb[k];
  return r;
}

__device__ static inline int32_t pos_at(const ten &t, int64_t i) {
  return *reinterpret_cast<const int32_t *>(t.p + i * t.nb[0]);
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

/* What a node served; queries past the first chunk are counted on the cpu
** only, since their positions lie on the device. */
static void count(const int32_t *params, int64_t n_queries) {
  const struct dca_state *st = (const struct dca_state *)dca_get_ptr(params, DCA_P_STATE);
  if (!st) return;
  st->host->engaged(st->self, "layers_served", 1);
  st->host->engaged(st->self, "tokens_served", (uint64_t)n_queries);
}

/* The tiled kernel's arguments for the query bands q0, q1, q2 [D, Hq, Nq] (each rotated at
** its band's positions, the same strides), k/v [D, Nkv, Hkv], q_pos [Nq], kv_pos [Nkv], mask
** [Nkv, Nq] or absent; dst [Dv, Hq, Nq] and rows past it (dca_split_rows). */
static tsr_tile_args tile_args_of(const struct tsr_device_call *call,
                                  const struct tsr_tensor_info *dst,
                                  const struct tsr_tensor_info *src, bool has_mask,
                                  bool has_counters, const int32_t *params) {
  const ten q = ten_of(&src[DCA_SRC_Q]), k = ten_of(&src[DCA_SRC_K]), v = ten_of(&src[DCA_SRC_V]);
  const ten qp = ten_of(&src[DCA_SRC_Q_POS]), kp = ten_of(&src[DCA_SRC_KV_POS]), out = ten_of(dst);
  tsr_tile_args t = {};
  /* the backend's attention choices (its pipelined loop, GQA decode kernel, split keys), as
  ** flash takes them */
  tsr_device_call_attn(call, &t.pipelined, &t.gqa_decode, &t.split_keys);
  t.f32 = tsr_device_call_f32(call);
  t.D = src[DCA_SRC_Q].ne[0], t.Hq = src[DCA_SRC_Q].ne[1], t.Nq = src[DCA_SRC_Q].ne[2];
  t.Dv = src[DCA_SRC_V].ne[0], t.Nkv = src[DCA_SRC_K].ne[1];
  t.group = src[DCA_SRC_K].ne[2] > 0 ? t.Hq / src[DCA_SRC_K].ne[2] : 0;
  t.q = q.p, t.q_row = q.nb[2], t.q_head = q.nb[1], t.q_nb0 = q.nb[0];
  t.q_bands[0] = (const char *)src[DCA_SRC_Q + 1].data;
  t.q_bands[1] = (const char *)src[DCA_SRC_Q + 2].data;
  t.k = k.p, t.k_type = k.type, t.k_nb0 = k.nb[0], t.k_nb1 = k.nb[1], t.k_nb2 = k.nb[2];
  t.v = v.p, t.v_type = v.type, t.v_nb0 = v.nb[0], t.v_nb1 = v.nb[1], t.v_nb2 = v.nb[2];
  t.q_pos = qp.p, t.q_pos_nb0 = qp.nb[0], t.kv_pos = kp.p, t.kv_pos_nb0 = kp.nb[0];
  if (has_mask) {
    const ten mk = ten_of(&src[DCA_SRC_MASK]);
    t.mask = mk.p, t.mask_f16 = mk.type == T_F16, t.mask_nb0 = mk.nb[0], t.mask_nb1 = mk.nb[1];
  }
  t.dst = const_cast<char *>(out.p), t.dst_row = out.nb[2], t.dst_head = out.nb[1];
  t.dst_nb0 = out.nb[0];
  memcpy(&t.scale, &params[DCA_P_SCALE], sizeof t.scale);
  memcpy(&t.softcap, &params[DCA_P_SOFTCAP], sizeof t.softcap);
  t.causal = 1;
  /* a decode step's V skipping (dca.h: the counters in the mask's place) */
  float skip;
  memcpy(&skip, &params[DCA_P_SKIP], sizeof skip);
  if (skip > 0.0f && !has_mask && has_counters) {
    t.skip_below = skip, t.sink = params[DCA_P_SINK], t.recent = params[DCA_P_RECENT];
    t.counters = (unsigned long long *)src[DCA_SRC_COUNTERS].data;
  }
  return t;
}

extern "C" TSR_PLUGIN_EXPORT void
dca_positions_cuda(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                   const struct tsr_tensor_info *src, int n_src, const int32_t *params) {
  (void)ith, (void)nth, (void)n_src;
  struct tsr_device_call *call = tsr_cuda_call_begin(ctx);
  if (tsr_device_call_graph(call) == TSR_DEVICE_CALL_REPLAY) return; /* counts nothing */
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
  const bool decode = dca_has_decode(params), eighth = n_src > DCA_SRC_MASK;
  tsr_tile_args t = tile_args_of(call, dst, src, eighth && !decode, eighth && decode, params);
  /* in a CUDA graph: the capture launches, the replay counts (as a call does below) */
  const int64_t graph = tsr_device_call_graph(call);
  if (graph == TSR_DEVICE_CALL_REPLAY) {
    if (t.Nq) count(params, t.Nq);
    return;
  }
  if (t.D > DCA_MAX_D || t.Dv > DCA_MAX_D) {
    if (call)
      call->status = host->set_error(TSR_ERR_UNSUPPORTED, "attn_dca on cuda: head dims %lld/%lld "
                                     "past %d", (long long)t.D, (long long)t.Dv, DCA_MAX_D);
    return;
  }
  if (params[DCA_P_BUDGET] != 0) { /* profile check refuses it: said, not ignored */
    if (call)
      call->status = host->set_error(TSR_ERR_UNSUPPORTED, "attn_dca on cuda: a decode policy's "
                                     "mass budget runs on the cpu only");
    return;
  }
  if (t.Nq == 0) return;
  /* the split partials: the output's rows past Nq (dca_split_rows), as many splits as fit */
  const int64_t room = (dst->ne[2] - t.Nq) * (int64_t)dst->nb[2];
  const int64_t per_split =
      t.Nq * t.Hq * (t.Dv + 2 + (t.skip_below > 0.0f)) * (int64_t)sizeof(float);
  t.max_splits = (int32_t)(room / per_split > 1 ? room / per_split : 1);
  if (tsr_tile_attn_plan(&t, tsr_cuda_sm_count(call ? call->device : 0)))
    t.part = reinterpret_cast<float *>(static_cast<char *>(dst->data) + t.Nq * (int64_t)dst->nb[2]);
  const dca_bands policy = {params[DCA_P_C], params[DCA_P_TEMP]};
  const cudaError_t e = tsr_tile_attn_launch(&t, policy, stream);
  if (e != cudaSuccess) {
    if (call)
      call->status = host->set_error(TSR_ERR_INTERNAL, "attn_dca on cuda: the attention kernel "
                                     "did not launch (head dims %lld/%lld, %lld queries): %s",
                                     (long long)t.D, (long long)t.Dv, (long long)t.Nq,
                                     cudaGetErrorString(e));
    return;
  }
  tsr_cuda_call_finish(ctx, call, "attn_dca attention");
  if (graph != TSR_DEVICE_CALL_CAPTURE) count(params, t.Nq);
}
