/*
** CPU kernels of Gated DeltaNet's conv1d and delta_rule ops (see
** ops_deltanet.h for shapes). Both split independent work across threads:
** conv1d by channel, delta_rule by value head (each head's recurrence is
** sequential in time). The state and dot products are f32, as transformers
** keeps them.
*/
#include <math.h>
#include <string.h>

#include "ops_deltanet.h"

static inline float at2(const struct tsr_tensor_info *t, int64_t i0, int64_t i1) {
  return *(const float *)((const char *)t->data + i0 * t->nb[0] + i1 * t->nb[1]);
}

static inline float at3(const struct tsr_tensor_info *t, int64_t i0, int64_t i1, int64_t i2) {
  return *(const float *)((const char *)t->data + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2]);
}

static void split(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
  int64_t per = (n + nth - 1) / nth;
  *lo = per * ith < n ? per * ith : n;
  *hi = *lo + per < n ? *lo + per : n;
}

/* x before t=0 reads zeros, or the carried history h[j, c] (j = 0 oldest)
** when a state is given, which is then replaced by the last K-1 inputs. */
static inline float conv_input(const struct tsr_tensor_info *x, const struct tsr_tensor_info *h,
                               int64_t c, int64_t t, int64_t k) {
  if (t >= 0) return at2(x, c, t);
  return h ? at2(h, k - 1 + t, c) : 0.0f;
}

void tsr_qwen_conv1d_cpu(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                         const struct tsr_tensor_info *src, int n_src, const int32_t *params) {
  (void)ctx, (void)params;
  const struct tsr_tensor_info *x = &src[0], *w = &src[1];
  const struct tsr_tensor_info *hin = n_src > 3 ? &src[2] : NULL, *hout = n_src > 3 ? &src[3] : NULL;
  const struct tsr_tensor_info *ckpt = n_src > 4 ? &src[4] : NULL;
  const int64_t n_ch = dst->ne[0], n = dst->ne[1], k = w->ne[0];
  int64_t lo, hi;
  split(n_ch, ith, nth, &lo, &hi);
  for (int64_t c = lo; c < hi; c++) {
    float *y = (float *)((char *)dst->data + c * dst->nb[0]);
    for (int64_t t = 0; t < n; t++) {
      float acc = 0.0f;
      /* tap j reads x[t - (k-1) + j]; without history, taps before the sequence read zeros */
      for (int64_t j = hin || t + 1 >= k ? 0 : k - 1 - t; j < k; j++)
        acc += at2(w, j, c) * conv_input(x, hin, c, t - (k - 1) + j, k);
      *(float *)((char *)y + t * dst->nb[1]) = acc;
      /* the history after step t: the k-1 inputs up to t (the old history is intact
      ** until this channel's loop over t ends) */
      for (int64_t j = 0; ckpt && j < k - 1; j++)
        *(float *)((char *)ckpt->data + j * ckpt->nb[0] + c * ckpt->nb[1] + t * ckpt->nb[2]) =
            conv_input(x, hin, c, t + 1 + j - (k - 1), k);
    }
    /* new history: the last k-1 of (history ++ x); ascending j reads index n+j >= j of the
    ** old history, so hout may alias hin */
    for (int64_t j = 0; hout && j < k - 1; j++)
      *(float *)((char *)hout->data + j * hout->nb[0] + c * hout->nb[1]) =
          conv_input(x, hin, c, n + j - (k - 1), k);
  }
}

void tsr_qwen_delta_rule_cpu(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                             const struct tsr_tensor_info *src, int n_src, const int32_t *params) {
  (void)ctx;
  const struct tsr_tensor_info *q = &src[0], *k = &src[1], *v = &src[2], *g = &src[3],
                               *beta = &src[4], *s0 = n_src > 5 ? &src[5] : NULL,
                               *ckpt = n_src > 6 ? &src[6] : NULL;
  const int64_t dk = q->ne[0], hk = q->ne[1], dv = v->ne[0], hv = v->ne[1], n = v->ne[2];
  const int64_t ratio = hv / hk;
  float qt[TSR_DELTA_MAX_DIM], kt[TSR_DELTA_MAX_DIM], u[TSR_DELTA_MAX_DIM];
  int64_t lo, hi;
  split(hv, ith, nth, &lo, &hi);
  for (int64_t h = lo; h < hi; h++) {
    const int64_t kh = params[0] == TSR_DELTA_GROUPED ? h / ratio : h % hk;
    /* row i of the state: dst[:, h, n + i], contiguous in j (dst is contiguous) */
#define ROW(i) ((float *)((char *)dst->data + h * dst->nb[1] + (n + (i)) * dst->nb[2]))
    for (int64_t i = 0; i < dk; i++) {
      float *s = ROW(i);
      for (int64_t j = 0; j < dv; j++) s[j] = s0 ? at3(s0, j, h, i) : 0.0f;
    }
    for (int64_t t = 0; t < n; t++) {
      const float decay = expf(at2(g, h, t)), b = at2(beta, h, t);
      for (int64_t i = 0; i < dk; i++) qt[i] = at3(q, i, kh, t), kt[i] = at3(k, i, kh, t);
      /* decay the state and read it at k: u = (e^g S)^T k */
      memset(u, 0, (size_t)dv * sizeof *u);
      for (int64_t i = 0; i < dk; i++) {
        float *s = ROW(i);
        for (int64_t j = 0; j < dv; j++) {
          s[j] *= decay;
          u[j] += s[j] * kt[i];
        }
      }
      /* the delta: beta (v - u), written into u */
      for (int64_t j = 0; j < dv; j++) u[j] = b * (at3(v, j, h, t) - u[j]);
      /* rank-one update, then read the new state at q */
      float *o = (float *)((char *)dst->data + h * dst->nb[1] + t * dst->nb[2]);
      memset(o, 0, (size_t)dv * sizeof *o);
      for (int64_t i = 0; i < dk; i++) {
        float *s = ROW(i);
        for (int64_t j = 0; j < dv; j++) {
          s[j] += kt[i] * u[j];
          o[j] += s[j] * qt[i];
        }
      }
      for (int64_t i = 0; ckpt && i < dk; i++) { /* the state after step t */
        const float *s = ROW(i);
        for (int64_t j = 0; j < dv; j++)
          *(float *)((char *)ckpt->data + j * ckpt->nb[0] + h * ckpt->nb[1] + i * ckpt->nb[2] +
                     t * ckpt->nb[3]) = s[j];
      }
    }
    if (s0 && params[1]) /* the final state back into the initial one: this head's only */
      for (int64_t i = 0; i < dk; i++) {
        const float *s = ROW(i);
        for (int64_t j = 0; j < dv; j++)
          *(float *)((char *)s0->data + j * s0->nb[0] + h * s0->nb[1] + i * s0->nb[2]) = s[j];
      }
#undef ROW
  }
}
