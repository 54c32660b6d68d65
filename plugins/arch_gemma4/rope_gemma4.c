/*
** Gemma 4's RoPE, rounded as transformers rounds it (plugin op
** "arch_gemma4.rope_f32", CPU kernel).
**
** The core's rope computes each angle in double. transformers computes it in
** float32 whatever the model's dtype: inv_freq = 1 / base^(2i/D) rounded to
** f32, then angle = f32(inv_freq * pos). At position p the angle's rounding
** is up to half an ulp of p * inv_freq (8e-6 rad near p = 160), and with
** attention scale 1 on RMS-normed heads the logits are large (|q.k| up to
** ~D), so that rounding moves the E2B fixture's logits by ~5e-5 of their
** scale: half the parity bar. Rounding the same way as the reference removes
** that part of the difference; the result is as exact as the core's rope,
** only rounded differently.
**
** NeoX pairing (i, i + D/2) over the whole head. freq_factors (rope_freqs,
** full layers) divide the angle: 1 for the rotated pairs, 1e30 for the
** pairs proportional RoPE leaves still, whose angle becomes ~0.
**
** Sources: x f32 [D, H, N] (contiguous rows), pos i32 [N], optionally
** ff f32 [D/2]. Params: base as the bits of a float.
*/
#include <math.h>
#include <string.h>

#include "gemma4.h"

#define GGUF_TYPE_F32 0
#define GGUF_TYPE_I32 26

static float inv_freq_f32(float base, int64_t i, int64_t d) {
  /* transformers: arange(0, D, 2).float() / D, then base ** that, then 1 / that */
  const float e = (float)(2 * i) / (float)d;
  const float p = (float)pow((double)base, (double)e);
  return 1.0f / p;
}

#define ROPE_CHUNK 256 /* pairs whose angles one pass holds; longer heads take several */

static void rope_kernel(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                        const struct tsr_tensor_info *src, int n_src, const int32_t *params) {
  (void)ctx;
  const struct tsr_tensor_info *x = &src[0], *pos = &src[1];
  const struct tsr_tensor_info *ff = n_src > 2 ? &src[2] : NULL;
  float base;
  memcpy(&base, &params[0], sizeof base);
  const int64_t d = x->ne[0], half = d / 2, nh = x->ne[1], n = x->ne[2];
  /* Each angle depends on the position and the pair alone: its cosine and sine once a token
  ** (and chunk of pairs) for every head. Tokens are split over the threads, or (fewer tokens
  ** than threads) the heads of each token. */
  float inv[ROPE_CHUNK], cs[ROPE_CHUNK], sn[ROPE_CHUNK];
  const int64_t tokens = n * x->ne[3], parts = tokens >= nth ? 1 : nth;
  for (int64_t i0 = 0; i0 < half; i0 += ROPE_CHUNK) {
    const int64_t m = half - i0 < ROPE_CHUNK ? half - i0 : ROPE_CHUNK;
    for (int64_t k = 0; k < m; k++) inv[k] = inv_freq_f32(base, i0 + k, d);
    for (int64_t u = ith; u < tokens * parts; u += nth) {
      const int64_t tb = u / parts, part = u % parts, t = tb % n, b = tb / n;
      const int64_t h0 = nh * part / parts, h1 = nh * (part + 1) / parts;
      if (h0 == h1) continue;
      const float p = (float)*(const int32_t *)((const char *)pos->data + t * pos->nb[0]);
      for (int64_t k = 0; k < m; k++) {
        float theta = inv[k] * p;
        if (ff) theta = theta / *(const float *)((const char *)ff->data + (i0 + k) * ff->nb[0]);
        cs[k] = cosf(theta), sn[k] = sinf(theta);
      }
      for (int64_t h = h0; h < h1; h++) {
        const float *xr = (const float *)((const char *)x->data + h * x->nb[1] +
                                          t * x->nb[2] + b * x->nb[3]);
        float *yr =
            (float *)((char *)dst->data + h * dst->nb[1] + t * dst->nb[2] + b * dst->nb[3]);
        for (int64_t k = 0; k < m; k++) {
          const int64_t i = i0 + k;
          const float c = cs[k], s = sn[k], x0 = xr[i], x1 = xr[i + half];
          /* q*cos + rotate_half(q)*sin, each product rounded on its own */
          const float a0 = x0 * c, b0 = x1 * s, a1 = x1 * c, b1 = x0 * s;
          yr[i] = a0 - b0;
          yr[i + half] = a1 + b1;
        }
      }
    }
  }
}

tsr_status gemma4_rope_register(const struct tsr_host *host, struct tsr_plugin *self,
                                int32_t *op_id) {
  /* the host's op registry lives for the process; a plugin object that is
  ** initialised again (a second host in one process) keeps its first id */
  if (*op_id >= 0) return TSR_OK;
  int32_t id;
  tsr_status st = host->kernel->register_op(self, "rope_f32", &id);
  if (st == TSR_OK) st = host->kernel->register_kernel(self, id, "cpu", rope_kernel, NULL);
  if (st == TSR_OK) st = gemma4_register_cuda(host, self, id, "gemma4_rope_f32_cuda");
  if (st == TSR_OK) *op_id = id;
  return st;
}

struct tsr_tensor *gemma4_rope(const struct tsr_host *host, struct tsr_graph *g, int32_t op_id,
                               struct tsr_tensor *x, struct tsr_tensor *pos,
                               struct tsr_tensor *ff, float base) {
  if (!x || !pos) return NULL;
  struct tsr_tensor_info xi, pi;
  host->graph->tensor_info(x, &xi);
  host->graph->tensor_info(pos, &pi);
  if (xi.dtype != GGUF_TYPE_F32 || pi.dtype != GGUF_TYPE_I32 || xi.ne[0] % 2 ||
      xi.nb[0] != sizeof(float) || pi.ne[0] != xi.ne[2]) {
    host->set_error(TSR_ERR_INVALID_ARG, "arch_gemma4 rope: x must be f32 [D even, H, N] with "
                    "contiguous rows and pos i32 [N] (D %lld, N %lld, pos %lld)",
                    (long long)xi.ne[0], (long long)xi.ne[2], (long long)pi.ne[0]);
    return NULL;
  }
  if (ff) {
    struct tsr_tensor_info fi;
    host->graph->tensor_info(ff, &fi);
    if (fi.dtype != GGUF_TYPE_F32 || fi.ne[0] != xi.ne[0] / 2) {
      host->set_error(TSR_ERR_FORMAT, "arch_gemma4 rope: rope_freqs has %lld entries for head "
                      "dim %lld (needs head dim / 2, f32)", (long long)fi.ne[0],
                      (long long)xi.ne[0]);
      return NULL;
    }
  }
  int32_t params[1];
  memcpy(&params[0], &base, sizeof base);
  struct tsr_tensor *src[3] = {x, pos, ff};
  return host->graph->custom_op(g, op_id, 4, xi.ne, src, ff ? 3 : 2, params, 1);
}

struct tsr_tensor *gemma4_rope_rotate(const struct tsr_attn_rope *rope, const struct tsr_host *host,
                                      struct tsr_graph *g, struct tsr_tensor *x,
                                      struct tsr_tensor *pos) {
  return gemma4_rope(host, g, *(const int32_t *)rope->rotate_ctx, x, pos, rope->freq_factors,
                     rope->freq_base);
}
