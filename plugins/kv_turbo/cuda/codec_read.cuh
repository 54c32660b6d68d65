/*
** The host side of a rotated codec's read kernel (kv_turbo's, kv_tcq's): flash's semantics
** over K and V as stored. One query against a group of at most 8 q heads with value head
** dims of 128, 256 or 512 runs the GPU's GQA decode kernel reading the blocks in register
** (Codec::gqa); anything else (prefill, several queries) lifts K and V into the call's
** scratch (Codec::lift) and runs the shared tile and tensor-core kernels on f16. Codec:
**   static int tier(const void *ctx, int32_t dtype)  the tier of a dtype, 0 for none
**   static int type(int tier)                         the GQA reader's type id
**   static cudaError_t ready(int device)              tables the kernels read, once
**   static cudaError_t gqa(int k_tier, int v_tier, const tsr_tile_args *, cudaStream_t)
**   static void lift(int tier, const tsr_tensor_info *, __half *out, cudaStream_t)
**   static constexpr const char *name                 "kv_turbo read"
*/
#ifndef KV_TURBO_CODEC_READ_CUH
#define KV_TURBO_CODEC_READ_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <string.h>

#include "tessera/cuda_attn_tile.cuh"
#include "tessera/plugin_cuda.h"

/* Whether one query's decode takes the GQA kernel reading the blocks in register. */
static inline bool codec_read_in_register(const tsr_tile_args *t) {
  return t->gqa_decode && t->Nq == 1 && t->group >= 1 && t->group <= 8 && t->D % 32 == 0 &&
         t->D <= TSR_TILE_MAX_D && (t->Dv == 128 || t->Dv == 256 || t->Dv == 512) &&
         t->k_nb1 % 2 == 0 && t->k_nb2 % 2 == 0 && t->v_nb1 % 2 == 0 && t->v_nb2 % 2 == 0;
}

template <class Codec>
static void codec_read(const void *ctx, const struct tsr_host *host,
                       const struct tsr_tensor_info *dst, const struct tsr_tensor_info *src,
                       const int32_t *params) {
  struct tsr_device_call *call = tsr_cuda_call_begin((void *)host);
  const cudaStream_t stream = tsr_cuda_call_stream(call);
  const struct tsr_tensor_info *q = &src[0], *k = &src[1], *v = &src[2], *mask = &src[3];
  const int kt = Codec::tier(ctx, k->dtype), vt = Codec::tier(ctx, v->dtype);
  auto fail = [&](tsr_status st, const char *what, const char *detail) {
    if (call) call->status = host->set_error(st, "%s: %s%s", Codec::name, what, detail);
  };
  if (!kt || !vt) return fail(TSR_ERR_INTERNAL, "K or V is not one of the codec's tiers", "");
  if (tsr_device_call_f32(call)) /* the profile check refuses this composition first */
    return fail(TSR_ERR_UNSUPPORTED, "the cuda read has f16 operands (in register or lifted), "
                                     "and backend.precision f32 computes in f32 only", "");
  tsr_tile_args t = {};
  tsr_device_call_attn(call, &t.pipelined, &t.gqa_decode, &t.split_keys);
  t.D = q->ne[0], t.Nq = q->ne[1], t.Hq = q->ne[2], t.Dv = v->ne[0], t.Nkv = k->ne[1];
  t.group = k->ne[2] > 0 ? t.Hq / k->ne[2] : 0;
  if (t.Nq <= 0 || t.Hq <= 0) return;
  t.q = (const char *)q->data, t.q_row = q->nb[1], t.q_head = q->nb[2], t.q_nb0 = q->nb[0];
  t.k = (const char *)k->data, t.k_type = Codec::type(kt), t.k_nb0 = 0, t.k_nb1 = k->nb[1];
  t.k_nb2 = k->nb[2];
  t.v = (const char *)v->data, t.v_type = Codec::type(vt), t.v_nb0 = 0, t.v_nb1 = v->nb[1];
  t.v_nb2 = v->nb[2];
  t.q_pos = (const char *)src[4].data, t.q_pos_nb0 = src[4].nb[0];
  t.kv_pos = (const char *)src[5].data, t.kv_pos_nb0 = src[5].nb[0];
  if (mask->data)
    t.mask = (const char *)mask->data, t.mask_f16 = mask->dtype == T_F16,
    t.mask_nb0 = mask->nb[0], t.mask_nb1 = mask->nb[1];
  t.dst = (char *)dst->data, t.dst_row = dst->nb[2], t.dst_head = dst->nb[1];
  t.dst_nb0 = dst->nb[0];
  memcpy(&t.scale, &params[0], sizeof t.scale);
  memcpy(&t.softcap, &params[1], sizeof t.softcap);
  t.causal = params[2] != 0, t.window = params[3];
  if (t.D > TSR_TILE_MAX_D || t.Dv > TSR_TILE_MAX_D || t.group < 1 || t.Hq % t.group)
    return fail(TSR_ERR_UNSUPPORTED, "head dims past 512 or a q head count that is not a "
                                     "multiple of the KV heads", "");
  const int n_sm = tsr_cuda_sm_count(call ? call->device : 0);
  cudaError_t e = Codec::ready(call ? call->device : 0);
  const bool reg = codec_read_in_register(&t);
  /* the split partials: as many as the planner could ask for at any context length, so
  ** the scratch does not grow from one decode step to the next */
  tsr_tile_args most = t;
  most.Nkv = (int64_t)1 << 40;
  const size_t part = tsr_tile_attn_plan(&most, n_sm);
  tsr_tile_attn_plan(&t, n_sm);
  auto room = [](size_t n) { return (n + 255) / 256 * 256; };
  const size_t kbytes = reg ? 0 : (size_t)(t.D * t.Nkv * k->ne[2]) * sizeof(__half);
  const size_t vbytes = reg ? 0 : (size_t)(t.Dv * t.Nkv * v->ne[2]) * sizeof(__half);
  void *scratch = NULL;
  tsr_status st = tsr_device_call_scratch(call, room(part) + room(kbytes) + vbytes, &scratch);
  if (st != TSR_OK) return fail(st, "no scratch from the backend", "");
  t.part = t.splits > 1 ? (float *)scratch : nullptr;
  if (e == cudaSuccess && reg) {
    e = Codec::gqa(kt, vt, &t, stream);
  } else if (e == cudaSuccess) {
    __half *kh = (__half *)((char *)scratch + room(part));
    __half *vh = (__half *)((char *)kh + room(kbytes));
    Codec::lift(kt, k, kh, stream);
    Codec::lift(vt, v, vh, stream);
    t.k = (const char *)kh, t.k_type = T_F16, t.k_nb0 = 2, t.k_nb1 = 2 * t.D;
    t.k_nb2 = 2 * t.D * t.Nkv;
    t.v = (const char *)vh, t.v_type = T_F16, t.v_nb0 = 2, t.v_nb1 = 2 * t.Dv;
    t.v_nb2 = 2 * t.Dv * t.Nkv;
    tsr_tile_attn_plan(&t, n_sm); /* the f16 kernels' own plan, within the same bound */
    t.part = t.splits > 1 ? (float *)scratch : nullptr;
    e = tsr_tile_attn_launch(&t, tsr_one_band{}, stream);
  }
  if (e != cudaSuccess)
    return fail(TSR_ERR_INTERNAL, "the attention kernel did not launch: ", cudaGetErrorString(e));
  tsr_cuda_call_finish((void *)host, call, Codec::name);
}

#endif
