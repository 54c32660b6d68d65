/*
** arch_gemma4's plugin ops on the cuda backend (arch_gemma4_cuda.so, opened
** by the host only when a cuda run checks a graph holding them; the plugin's
** own .so links no CUDA). Semantics are the cpu kernels' (rope_gemma4.c,
** ordered_logits_gemma4.c), with every product and sum rounded on its own
** (no fused multiply-add) so that the device writes the cpu's floats:
**   rope_f32        inv_freq is computed on the host with the cpu kernel's
**                   own expression (glibc pow) and handed to the kernel; the
**                   angle is the same f32 product and quotient; cos and sin
**                   are taken in double and rounded to f32, which is glibc
**                   cosf/sinf's value except where one of them misrounds by
**                   an ulp (rare; tests/gpu allows 1e-6 of the output scale).
**   ordered_logits  exact: the same top-k order (larger first, lower index on
**                   ties; a row holding NaN takes the cpu's scan itself), the
**                   same minimum, the same writes.
** The calling convention is include/tessera/plugin_cuda.h's.
*/
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "tessera/plugin_cuda.h"

static void refuse(void *ctx, struct tsr_device_call *call, const char *msg) {
  const struct tsr_host *host = (const struct tsr_host *)ctx;
  if (call) call->status = host->set_error(TSR_ERR_UNSUPPORTED, "%s", msg);
}

/* ---- rope_f32 ------------------------------------------------------------------- */

enum { ROPE_MAX_HALF = 256 }; /* head dims up to 512: the table travels as a parameter */

struct inv_table {
  float v[ROPE_MAX_HALF];
};

struct rope_args {
  const char *x, *pos, *ff;
  char *y;
  long long xnb[4], ynb[4], pnb0, ffnb0;
  long long half, nh, n, rows;
};

__global__ void k_rope_gemma4(struct rope_args a, struct inv_table inv) {
  const long long total = a.rows * a.half;
  for (long long f = blockIdx.x * (long long)blockDim.x + threadIdx.x; f < total;
       f += (long long)gridDim.x * blockDim.x) {
    const long long i = f % a.half, r = f / a.half;
    const long long h = r % a.nh, t = (r / a.nh) % a.n, b = r / (a.nh * a.n);
    const float *xr = (const float *)(a.x + h * a.xnb[1] + t * a.xnb[2] + b * a.xnb[3]);
    float *yr = (float *)(a.y + h * a.ynb[1] + t * a.ynb[2] + b * a.ynb[3]);
    const float p = (float)*(const int *)(a.pos + t * a.pnb0);
    float theta = __fmul_rn(inv.v[i], p);
    if (a.ff) theta = __fdiv_rn(theta, *(const float *)(a.ff + i * a.ffnb0));
    const float c = (float)cos((double)theta), s = (float)sin((double)theta);
    const float x0 = xr[i], x1 = xr[i + a.half];
    yr[i] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    yr[i + a.half] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
  }
}

extern "C" TSR_PLUGIN_EXPORT void gemma4_rope_f32_cuda(void *ctx, int ith, int nth,
                                                       const struct tsr_tensor_info *dst,
                                                       const struct tsr_tensor_info *src,
                                                       int n_src, const int32_t *params) {
  (void)ith, (void)nth;
  struct tsr_device_call *call = tsr_cuda_call_begin(ctx);
  if (tsr_device_call_graph(call) == TSR_DEVICE_CALL_REPLAY) return; /* counts nothing */
  const struct tsr_tensor_info *x = &src[0], *pos = &src[1];
  const struct tsr_tensor_info *ff = n_src > 2 ? &src[2] : NULL;
  float base;
  memcpy(&base, &params[0], sizeof base);
  const long long d = x->ne[0], half = d / 2;
  if (half > ROPE_MAX_HALF) {
    refuse(ctx, call, "arch_gemma4 rope_f32 on cuda: head dims above 512 are not built");
    return;
  }
  /* the cpu kernel's inv_freq_f32, bit for bit: same expression, same libm */
  struct inv_table inv;
  for (long long i = 0; i < half; i++) {
    const float e = (float)(2 * i) / (float)d;
    const float p = (float)pow((double)base, (double)e);
    inv.v[i] = 1.0f / p;
  }
  struct rope_args a;
  a.x = (const char *)x->data, a.pos = (const char *)pos->data;
  a.ff = ff ? (const char *)ff->data : NULL, a.y = (char *)dst->data;
  for (int k = 0; k < 4; k++) a.xnb[k] = (long long)x->nb[k], a.ynb[k] = (long long)dst->nb[k];
  a.pnb0 = (long long)pos->nb[0], a.ffnb0 = ff ? (long long)ff->nb[0] : 0;
  a.half = half, a.nh = x->ne[1], a.n = x->ne[2], a.rows = x->ne[1] * x->ne[2] * x->ne[3];
  long long blocks = (a.rows * half + 255) / 256;
  if (blocks > 65535) blocks = 65535;
  if (blocks < 1) blocks = 1;
  k_rope_gemma4<<<(unsigned)blocks, 256, 0, tsr_cuda_call_stream(call)>>>(a, inv);
  tsr_cuda_call_finish(ctx, call, "arch_gemma4 rope_f32");
}

/* ---- ordered_logits ------------------------------------------------------------- */

enum { OL_THREADS = 256, OL_MAX_K = 64 };

/* a ranks above b: larger, or equal and a lower index (b < 0: nothing yet) */
__device__ static bool above(float va, int ia, float vb, int ib) {
  return ib < 0 || va > vb || (va == vb && ia < ib);
}

struct ol_args {
  const char *full, *cent, *ord;
  char *y;
  long long fnb0, fnb1, cnb0, cnb1, ynb0, ynb1;
  long long V, C, per, k;
};

/* One block per token: top-k clusters, the smallest kept logit, the row. */
__global__ void k_ordered_logits(struct ol_args a) {
  __shared__ int idx[OL_MAX_K];
  __shared__ float shv[OL_THREADS];
  __shared__ int shi[OL_THREADS];
  __shared__ int has_nan;
  const long long t = blockIdx.x;
  const char *c = a.cent + t * a.cnb1, *f = a.full + t * a.fnb1;
  char *y = a.y + t * a.ynb1;
  const int *ordering = (const int *)a.ord;
  const int tid = threadIdx.x;
  if (tid == 0) has_nan = 0;
  __syncthreads();
  for (long long i = tid; i < a.C; i += blockDim.x) {
    const float v = *(const float *)(c + i * a.cnb0);
    if (v != v) has_nan = 1;
  }
  __syncthreads();
  if (has_nan) {
    /* the cpu's scan, as it is: a NaN makes the order depend on it */
    if (tid == 0)
      for (long long j = 0; j < a.k; j++) {
        long long best = -1;
        for (long long i = 0; i < a.C; i++) {
          bool taken = false;
          for (long long q = 0; q < j && !taken; q++) taken = idx[q] == i;
          if (!taken && (best < 0 || *(const float *)(c + i * a.cnb0) >
                                         *(const float *)(c + best * a.cnb0)))
            best = i;
        }
        idx[j] = (int)best;
      }
  } else {
    for (long long j = 0; j < a.k; j++) {
      float bv = 0.0f;
      int bi = -1;
      for (long long i = tid; i < a.C; i += blockDim.x) {
        bool taken = false;
        for (long long q = 0; q < j && !taken; q++) taken = idx[q] == i;
        const float v = *(const float *)(c + i * a.cnb0);
        if (!taken && above(v, (int)i, bv, bi)) bv = v, bi = (int)i;
      }
      shv[tid] = bv;
      shi[tid] = bi;
      __syncthreads();
      for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (tid < w && shi[tid + w] >= 0 && above(shv[tid + w], shi[tid + w], shv[tid], shi[tid]))
          shv[tid] = shv[tid + w], shi[tid] = shi[tid + w];
        __syncthreads();
      }
      if (tid == 0) idx[j] = shi[0];
      __syncthreads();
    }
  }
  __syncthreads();
  /* the smallest kept logit (NaN never replaces it, as on the cpu) */
  float lo = FLT_MAX;
  for (long long e = tid; e < a.k * a.per; e += blockDim.x) {
    const float v = *(const float *)(f + ordering[idx[e / a.per] * a.per + e % a.per] * a.fnb0);
    if (v < lo) lo = v;
  }
  shv[tid] = lo;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (tid < w && shv[tid + w] < shv[tid]) shv[tid] = shv[tid + w];
    __syncthreads();
  }
  const float fill = __fsub_rn(shv[0], 1.0f);
  for (long long i = tid; i < a.V; i += blockDim.x) *(float *)(y + i * a.ynb0) = fill;
  __syncthreads();
  for (long long e = tid; e < a.k * a.per; e += blockDim.x) {
    const int tok = ordering[idx[e / a.per] * a.per + e % a.per];
    *(float *)(y + tok * a.ynb0) = *(const float *)(f + tok * a.fnb0);
  }
}

extern "C" TSR_PLUGIN_EXPORT void gemma4_ordered_logits_cuda(void *ctx, int ith, int nth,
                                                             const struct tsr_tensor_info *dst,
                                                             const struct tsr_tensor_info *src,
                                                             int n_src, const int32_t *params) {
  (void)ith, (void)nth, (void)n_src;
  struct tsr_device_call *call = tsr_cuda_call_begin(ctx);
  if (tsr_device_call_graph(call) == TSR_DEVICE_CALL_REPLAY) return; /* counts nothing */
  const struct tsr_tensor_info *full = &src[0], *cent = &src[1], *ord = &src[2];
  struct ol_args a;
  a.full = (const char *)full->data, a.cent = (const char *)cent->data;
  a.ord = (const char *)ord->data, a.y = (char *)dst->data;
  a.fnb0 = (long long)full->nb[0], a.fnb1 = (long long)full->nb[1];
  a.cnb0 = (long long)cent->nb[0], a.cnb1 = (long long)cent->nb[1];
  a.ynb0 = (long long)dst->nb[0], a.ynb1 = (long long)dst->nb[1];
  a.V = full->ne[0], a.C = cent->ne[0], a.per = full->ne[0] / cent->ne[0], a.k = params[0];
  if (a.k > OL_MAX_K) { /* the builder admits at most 64 */
    refuse(ctx, call, "arch_gemma4 ordered_logits on cuda: top-k above 64");
    return;
  }
  k_ordered_logits<<<(unsigned)full->ne[1], OL_THREADS, 0,
                     tsr_cuda_call_stream(call)>>>(a);
  tsr_cuda_call_finish(ctx, call, "arch_gemma4 ordered_logits");
}
