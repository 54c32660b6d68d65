/*
** Gated DeltaNet's conv1d and delta_rule on the cuda backend
** (arch_qwen_cuda.so, opened by the host only when a cuda run checks a graph
** holding them; the plugin's own .so links no CUDA). Shapes, state and
** in-place semantics are ops_deltanet.h's; the arithmetic is ops_deltanet.c's
** in the same order with every product and sum rounded on its own (no fused
** multiply-add):
**   conv1d      a thread per channel runs the cpu's loop for that channel:
**               the outputs, then the new history over the old one (the cpu
**               splits by channel too, so aliasing history in/out behaves
**               the same). Exact.
**   delta_rule  a block per value head, a thread per state column j: the cpu
**               accumulates u[j] and o[j] over i in ascending order, and so
**               does the thread, so the sums are the cpu's; the state lives
**               where the cpu keeps it (dst's last dk rows). The decay is
**               exp taken in double and rounded to f32: glibc expf's value
**               except where expf misrounds by an ulp (rare).
** The calling convention is include/tessera/plugin_cuda.h's.
*/
#include <cuda_runtime.h>
#include <math.h>

#include "../ops_deltanet.h"
#include "tessera/plugin_cuda.h"

/* A tensor as the kernels read it: device address and byte strides. */
struct ten {
  char *p;
  long long nb[4];
};

static struct ten ten_of(const struct tsr_tensor_info *t) {
  struct ten r = {(char *)t->data, {0, 0, 0, 0}};
  for (int k = 0; k < 4; k++) r.nb[k] = (long long)t->nb[k];
  return r;
}

__device__ static inline float *at(const struct ten &t, long long i0, long long i1, long long i2) {
  return (float *)(t.p + i0 * t.nb[0] + i1 * t.nb[1] + i2 * t.nb[2]);
}

__device__ static inline float *at4(const struct ten &t, long long i0, long long i1, long long i2,
                                    long long i3) {
  return (float *)(t.p + i0 * t.nb[0] + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3]);
}

static unsigned blocks_for(long long n, int per) {
  long long b = (n + per - 1) / per;
  return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

/* ---- conv1d -------------------------------------------------------------------- */

__device__ static inline float conv_input(const struct ten &x, const struct ten &h, bool has_h,
                                          long long c, long long t, long long k) {
  if (t >= 0) return *at(x, c, t, 0);
  return has_h ? *at(h, k - 1 + t, c, 0) : 0.0f;
}

__global__ void k_conv1d(struct ten y, struct ten x, struct ten w, struct ten hin, struct ten hout,
                         struct ten ckpt, int has_h, long long n_ch, long long n, long long k) {
  for (long long c = blockIdx.x * (long long)blockDim.x + threadIdx.x; c < n_ch;
       c += (long long)gridDim.x * blockDim.x) {
    for (long long t = 0; t < n; t++) {
      float acc = 0.0f;
      for (long long j = has_h || t + 1 >= k ? 0 : k - 1 - t; j < k; j++)
        acc = __fadd_rn(acc, __fmul_rn(*at(w, j, c, 0), conv_input(x, hin, has_h, c, t - (k - 1) + j, k)));
      *at(y, c, t, 0) = acc;
      for (long long j = 0; ckpt.p && j < k - 1; j++) /* the history after step t */
        *at(ckpt, j, c, t) = conv_input(x, hin, has_h, c, t + 1 + j - (k - 1), k);
    }
    for (long long j = 0; has_h && j < k - 1; j++)
      *at(hout, j, c, 0) = conv_input(x, hin, has_h, c, n + j - (k - 1), k);
  }
}

extern "C" TSR_PLUGIN_EXPORT void qwen_conv1d_cuda(void *ctx, int ith, int nth,
                                                   const struct tsr_tensor_info *dst,
                                                   const struct tsr_tensor_info *src, int n_src,
                                                   const int32_t *params) {
  (void)ith, (void)nth, (void)params;
  struct tsr_device_call *call = tsr_cuda_call_begin(ctx);
  if (tsr_device_call_graph(call) == TSR_DEVICE_CALL_REPLAY) return; /* counts nothing */
  const bool has_h = n_src > 3;
  const struct ten none = {NULL, {0, 0, 0, 0}};
  const long long n_ch = dst->ne[0];
  k_conv1d<<<blocks_for(n_ch, 128), 128, 0, tsr_cuda_call_stream(call)>>>(
      ten_of(dst), ten_of(&src[0]), ten_of(&src[1]), has_h ? ten_of(&src[2]) : none,
      has_h ? ten_of(&src[3]) : none, n_src > 4 ? ten_of(&src[4]) : none, has_h, n_ch,
      dst->ne[1], src[1].ne[0]);
  tsr_cuda_call_finish(ctx, call, "arch_qwen conv1d");
}

/* ---- delta_rule -------------------------------------------------------------------- */

__global__ void k_delta_rule(struct ten dst, struct ten q, struct ten k, struct ten v, struct ten g,
                             struct ten beta, struct ten s0, struct ten ckpt, int has_s0,
                             int grouped, int write_back,
                             long long dk, long long hk, long long dv, long long hv, long long n) {
  const long long h = blockIdx.x, ratio = hv / hk;
  const long long kh = grouped ? h / ratio : h % hk;
  for (long long j = threadIdx.x; j < dv; j += blockDim.x) {
    /* column j of this head's state: dst[j, h, n + i] */
#define S(i) (*at(dst, j, h, n + (i)))
    for (long long i = 0; i < dk; i++) S(i) = has_s0 ? *at(s0, j, h, i) : 0.0f;
    for (long long t = 0; t < n; t++) {
      const float decay = (float)exp((double)*at(g, h, t, 0)), b = *at(beta, h, t, 0);
      float u = 0.0f;
      for (long long i = 0; i < dk; i++) {
        const float s = __fmul_rn(S(i), decay);
        S(i) = s;
        u = __fadd_rn(u, __fmul_rn(s, *at(k, i, kh, t)));
      }
      u = __fmul_rn(b, __fsub_rn(*at(v, j, h, t), u));
      float o = 0.0f;
      for (long long i = 0; i < dk; i++) {
        const float s = __fadd_rn(S(i), __fmul_rn(*at(k, i, kh, t), u));
        S(i) = s;
        o = __fadd_rn(o, __fmul_rn(s, *at(q, i, kh, t)));
      }
      *at(dst, j, h, t) = o;
      for (long long i = 0; ckpt.p && i < dk; i++) *at4(ckpt, j, h, i, t) = S(i); /* after step t */
    }
    if (has_s0 && write_back)
      for (long long i = 0; i < dk; i++) *at(s0, j, h, i) = S(i);
#undef S
  }
}

extern "C" TSR_PLUGIN_EXPORT void qwen_delta_rule_cuda(void *ctx, int ith, int nth,
                                                       const struct tsr_tensor_info *dst,
                                                       const struct tsr_tensor_info *src,
                                                       int n_src, const int32_t *params) {
  (void)ith, (void)nth;
  struct tsr_device_call *call = tsr_cuda_call_begin(ctx);
  if (tsr_device_call_graph(call) == TSR_DEVICE_CALL_REPLAY) return; /* counts nothing */
  const struct tsr_tensor_info *q = &src[0], *v = &src[2];
  const bool has_s0 = n_src > 5;
  const struct ten none = {NULL, {0, 0, 0, 0}};
  const long long dv = v->ne[0];
  const int threads = dv >= 128 ? 128 : (int)((dv + 31) / 32 * 32);
  k_delta_rule<<<(unsigned)v->ne[1], threads, 0, tsr_cuda_call_stream(call)>>>(
      ten_of(dst), ten_of(q), ten_of(&src[1]), ten_of(v), ten_of(&src[3]), ten_of(&src[4]),
      has_s0 ? ten_of(&src[5]) : none, n_src > 6 ? ten_of(&src[6]) : none, has_s0,
      params[0] == TSR_DELTA_GROUPED, params[1], q->ne[0],
      q->ne[1], dv, v->ne[1], v->ne[2]);
  tsr_cuda_call_finish(ctx, call, "arch_qwen delta_rule");
}
