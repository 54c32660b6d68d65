/*
** Row-wise CPU kernels: rms_norm, l2_norm, softmax and rope.
**
** Each kernel splits the destination's rows across threads, reads its
** sources through their byte strides (views need no copy) and writes the
** contiguous f32 destination. Sums of squares and softmax denominators
** accumulate in double: rows can be a million entries long (attention
** scores at 1M context) and the cost is small next to the exp and the loads.
*/
#include <math.h>
#include <string.h>

#include "graph/dtype.h"
#include "cpu_ops.h"


static double sum_squares(const float *y, int64_t n) {
  double s = 0.0;
  for (int64_t j = 0; j < n; j++) s += (double)y[j] * y[j];
  return s;
}

/* ---- rms_norm, l2_norm -------------------------------------------------- */

/* y = x / sqrt(mean(x^2) + eps), times w (broadcast over rows) when given. */
TSR_CPU_KERNEL(rms_norm) {
  const struct tsr_tensor *a = dst->src[0], *w = dst->src[1];
  const int64_t ne0 = dst->ne[0];
  const double eps = tsr_param_f32(dst, 0);
  int64_t lo, hi;
  tsr_cpu_split(c, tsr_tensor_nrows(dst), &lo, &hi);
  for (int64_t r = lo; r < hi; r++) {
    int64_t i1, i2, i3;
    tsr_cpu_row_coords(dst, r, &i1, &i2, &i3);
    float *y = (float *)dst->data + r * ne0;
    tsr_cpu_load_row_f32(y, tsr_cpu_row_at(a, i1, i2, i3), a->nb[0], ne0);
    const float s = (float)(1.0 / sqrt(sum_squares(y, ne0) / (double)ne0 + eps));
    if (!w) {
      for (int64_t j = 0; j < ne0; j++) y[j] *= s;
      continue;
    }
    const char *wr = tsr_cpu_row_at(w, i1 % w->ne[1], i2 % w->ne[2], i3 % w->ne[3]);
    const size_t ws = w->nb[0];
    for (int64_t j = 0; j < ne0; j++) y[j] = (y[j] * s) * tsr_cpu_load_f32(wr, ws, j);
  }
}

/* y = x / sqrt(sum(x^2) + eps): eps inside the root, as Hugging Face's
** l2norm for Qwen3-Next's gated delta net (and the FLA kernels it mirrors)
** computes x * rsqrt(sum(x^2) + eps), eps = 1e-6. This is not
** x / max(||x||, eps) (F.normalize's form); the two differ by about
** eps / (2 sum(x^2)) relative, and only rows near zero tell them apart. */
TSR_CPU_KERNEL(l2_norm) {
  const struct tsr_tensor *a = dst->src[0];
  const int64_t ne0 = dst->ne[0];
  const double eps = tsr_param_f32(dst, 0);
  int64_t lo, hi;
  tsr_cpu_split(c, tsr_tensor_nrows(dst), &lo, &hi);
  for (int64_t r = lo; r < hi; r++) {
    int64_t i1, i2, i3;
    tsr_cpu_row_coords(dst, r, &i1, &i2, &i3);
    float *y = (float *)dst->data + r * ne0;
    tsr_cpu_load_row_f32(y, tsr_cpu_row_at(a, i1, i2, i3), a->nb[0], ne0);
    const float s = (float)(1.0 / sqrt(sum_squares(y, ne0) + eps));
    for (int64_t j = 0; j < ne0; j++) y[j] *= s;
  }
}

/* ---- softmax ------------------------------------------------------------ */

/* softmax(a*scale + mask) over dim 0, with the row maximum subtracted so
** large logits cannot overflow. A row whose entries are all -inf (fully
** masked) has no distribution; it comes out as zeros, never NaN, matching
** what attention does with a fully masked row. */
TSR_CPU_KERNEL(softmax) {
  const struct tsr_tensor *a = dst->src[0], *m = dst->src[1];
  const int64_t ne0 = dst->ne[0];
  const float scale = tsr_param_f32(dst, 0);
  int64_t lo, hi;
  tsr_cpu_split(c, tsr_tensor_nrows(dst), &lo, &hi);
  for (int64_t r = lo; r < hi; r++) {
    int64_t i1, i2, i3;
    tsr_cpu_row_coords(dst, r, &i1, &i2, &i3);
    float *y = (float *)dst->data + r * ne0;
    tsr_cpu_load_row_f32(y, tsr_cpu_row_at(a, i1, i2, i3), a->nb[0], ne0);
    for (int64_t j = 0; j < ne0; j++) y[j] *= scale;
    if (m) {
      /* the mask is [ne0, ne1] and repeats over dims 2 and 3 */
      const char *mr = tsr_cpu_row_at(m, i1, i2 % m->ne[2], i3 % m->ne[3]);
      const int64_t ms = (int64_t)m->nb[0];
      if (m->dtype == TSR_F16) {
        for (int64_t j = 0; j < ne0; j++) {
          uint16_t h;
          memcpy(&h, mr + j * ms, sizeof h);
          y[j] += tsr_f16_to_f32(h);
        }
      } else {
        for (int64_t j = 0; j < ne0; j++) y[j] += tsr_cpu_load_f32(mr, (size_t)ms, j);
      }
    }
    float max = -INFINITY;
    for (int64_t j = 0; j < ne0; j++) max = y[j] > max ? y[j] : max;
    if (max == -INFINITY) {
      memset(y, 0, (size_t)ne0 * sizeof *y);
      continue;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < ne0; j++) {
      y[j] = expf(y[j] - max);
      sum += y[j];
    }
    /* sum >= 1: the maximum's own term is exp(0) */
    const float inv = (float)(1.0 / sum);
    for (int64_t j = 0; j < ne0; j++) y[j] *= inv;
  }
}

/* ---- rope --------------------------------------------------------------- */

/* Pairs whose cos/sin one cache fill holds; longer rotations refill per row. */
#define ROPE_CACHE_PAIRS 256

/* a[D,H,N]: row (head i1, token i2) rotates pair i of its first n_rot dims by
** theta_i = pos[i2] * freq_scale * freq_base^(-2i/n_rot) / ff[i]. NORMAL
** pairs (x[2i], x[2i+1]), NEOX pairs (x[i], x[i + n_rot/2]); dims from
** n_rot on are copied bit for bit.
**
** The angle and its cos/sin are computed in double. At long context a f32
** product pos * inv_freq is off by up to half an ulp of the angle (0.03 rad
** at pos 1e6), which is a visible error in the rotated vector; in double it
** stays below 1e-9. Rows are numbered token-major, so a thread's rows share
** each token's cos/sin cache across all heads. */
TSR_CPU_KERNEL(rope) {
  const struct tsr_tensor *a = dst->src[0], *pos = dst->src[1], *ff = dst->src[2];
  const int64_t ne0 = dst->ne[0], n_heads = dst->ne[1];
  const int n_rot = dst->op_params[0];
  const bool neox = dst->op_params[1] == TSR_ROPE_NEOX;
  const double base = tsr_param_f32(dst, 2), freq_scale = tsr_param_f32(dst, 3);
  const int64_t half = n_rot / 2;
  const size_t as = a->nb[0];

  float cos_c[ROPE_CACHE_PAIRS], sin_c[ROPE_CACHE_PAIRS];
  double pow_c[ROPE_CACHE_PAIRS]; /* base^(-2i/n_rot) of the cached pairs, whatever the token */
  int64_t cached_tok = -1, cached_first = -1, pow_first = -1;

  int64_t lo, hi;
  tsr_cpu_split(c, tsr_tensor_nrows(dst), &lo, &hi);
  for (int64_t r = lo; r < hi; r++) {
    const int64_t i1 = r % n_heads, i2 = r / n_heads;
    const char *x = tsr_cpu_row_at(a, i1, i2, 0);
    float *y = (float *)dst->data + r * ne0;
    int32_t p;
    memcpy(&p, (const char *)pos->data + i2 * (int64_t)pos->nb[0], sizeof p);

    for (int64_t first = 0; first < half; first += ROPE_CACHE_PAIRS) {
      const int64_t n = half - first < ROPE_CACHE_PAIRS ? half - first : ROPE_CACHE_PAIRS;
      if (pow_first != first) {
        for (int64_t k = 0; k < n; k++) pow_c[k] = pow(base, -2.0 * (double)(first + k) / n_rot);
        pow_first = first;
      }
      if (cached_tok != i2 || cached_first != first) {
        for (int64_t k = 0; k < n; k++) {
          const int64_t i = first + k;
          double theta = (double)p * freq_scale * pow_c[k];
          if (ff) theta /= tsr_cpu_load_f32((const char *)ff->data, ff->nb[0], i);
          cos_c[k] = (float)cos(theta);
          sin_c[k] = (float)sin(theta);
        }
        cached_tok = i2;
        cached_first = first;
      }
      for (int64_t k = 0; k < n; k++) {
        const int64_t i = first + k;
        const int64_t j0 = neox ? i : 2 * i, j1 = neox ? i + half : 2 * i + 1;
        const float x0 = tsr_cpu_load_f32(x, as, j0), x1 = tsr_cpu_load_f32(x, as, j1);
        y[j0] = x0 * cos_c[k] - x1 * sin_c[k];
        y[j1] = x0 * sin_c[k] + x1 * cos_c[k];
      }
    }
    /* the pass-through tail, bit for bit */
    if (as == sizeof(float)) {
      memcpy(y + n_rot, x + n_rot * (int64_t)as, (size_t)(ne0 - n_rot) * sizeof(float));
    } else {
      for (int64_t j = n_rot; j < ne0; j++) memcpy(y + j, x + j * (int64_t)as, sizeof(float));
    }
  }
}
