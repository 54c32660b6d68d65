/*
** Elementwise CPU kernels: add and mul (b broadcast over a), scale, the
** unary activations, glu and softcap.
**
** Each kernel splits the destination's rows (ne1*ne2*ne3) across threads.
** Sources are read through their byte strides, so permuted and strided
** views work without a copy; the destination is contiguous f32, as the
** builder allocates it. A row is first gathered into the destination and
** then transformed in place, so the arithmetic loops only ever see
** contiguous floats.
*/
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "cpu_ops.h"
#include "vec.h"


/* ---- add, mul ----------------------------------------------------------- */

/* mul is a compile-time constant at both call sites, so each gets its own loops. */
static inline void binary(const struct tsr_cpu_compute *c, struct tsr_tensor *dst, const bool mul) {
  const struct tsr_tensor *a = dst->src[0], *b = dst->src[1];
  const int64_t ne0 = dst->ne[0], bne0 = b->ne[0];
  const size_t bs = b->nb[0];
  int64_t lo, hi;
  tsr_cpu_split(c, tsr_tensor_nrows(dst), &lo, &hi);
  for (int64_t r = lo; r < hi; r++) {
    int64_t i1, i2, i3;
    tsr_cpu_row_coords(dst, r, &i1, &i2, &i3);
    float *y = (float *)dst->data + r * ne0;
    const char *br = tsr_cpu_row_at(b, i1 % b->ne[1], i2 % b->ne[2], i3 % b->ne[3]);
    tsr_cpu_load_row_f32(y, tsr_cpu_row_at(a, i1, i2, i3), a->nb[0], ne0);
    if (bne0 == 1) {
      const float v = tsr_cpu_load_f32(br, bs, 0);
      for (int64_t j = 0; j < ne0; j++) y[j] = mul ? y[j] * v : y[j] + v;
    } else if (bne0 == ne0 && bs == sizeof(float)) {
      for (int64_t j = 0; j < ne0; j++) {
        const float v = tsr_cpu_load_f32(br, sizeof(float), j);
        y[j] = mul ? y[j] * v : y[j] + v;
      }
    } else {
      /* b's row repeats ne0/bne0 times along the row */
      for (int64_t j0 = 0; j0 < ne0; j0 += bne0)
        for (int64_t j = 0; j < bne0; j++) {
          const float v = tsr_cpu_load_f32(br, bs, j);
          y[j0 + j] = mul ? y[j0 + j] * v : y[j0 + j] + v;
        }
    }
  }
}

TSR_CPU_KERNEL(add) { binary(c, dst, false); }
TSR_CPU_KERNEL(mul) { binary(c, dst, true); }

/* ---- one-input row maps ------------------------------------------------- */

static inline float sigmoid_f(float x) {
  /* for x below about -88 expf(-x) is +inf and the quotient is 0, the right
  ** limit; no branch needed, and no NaN for any finite or infinite x */
  return 1.0f / (1.0f + expf(-x));
}

/* 0.5x(1 + tanh(u)) with u = sqrt(2/pi)(x + 0.044715x^3), written as
** x*sigmoid(2u), the same function: 1 + tanh(u) cancels to nothing for
** negative x in f32, the sigmoid form keeps full relative precision. */
static inline float gelu_tanh_f(float x) {
  const float k2 = 2.0f * 0.7978845608028654f;
  return x * sigmoid_f(k2 * (x + 0.044715f * x * x * x));
}

static inline float softplus_f(float x) {
  /* past 20, log(1+e^x) equals x to f32 precision and e^x would overflow later */
  return x > 20.0f ? x : log1pf(expf(x));
}

static void activate(enum tsr_unary_op op, float *y, int64_t n) {
  switch (op) {
  case TSR_UNARY_GELU:
    if (!tsr_vec_gelu_f32(y, n))
      for (int64_t j = 0; j < n; j++) y[j] = gelu_tanh_f(y[j]);
    break;
  case TSR_UNARY_SILU:
    if (!tsr_vec_silu_f32(y, n))
      for (int64_t j = 0; j < n; j++) y[j] = y[j] * sigmoid_f(y[j]);
    break;
  case TSR_UNARY_SIGMOID:
    for (int64_t j = 0; j < n; j++) y[j] = sigmoid_f(y[j]);
    break;
  case TSR_UNARY_SOFTPLUS:
    for (int64_t j = 0; j < n; j++) y[j] = softplus_f(y[j]);
    break;
  case TSR_UNARY_TANH:
    for (int64_t j = 0; j < n; j++) y[j] = tanhf(y[j]);
    break;
  case TSR_UNARY_RELU:
    for (int64_t j = 0; j < n; j++) y[j] = y[j] > 0.0f ? y[j] : 0.0f;
    break;
  case TSR_UNARY_NEG:
    for (int64_t j = 0; j < n; j++) y[j] = -y[j];
    break;
  case TSR_UNARY_EXP:
    for (int64_t j = 0; j < n; j++) y[j] = expf(y[j]);
    break;
  case TSR_UNARY_COUNT:
    break; /* the builder refuses it */
  }
}

enum row_map { MAP_SCALE, MAP_UNARY, MAP_SOFTCAP };

static void map_rows(const struct tsr_cpu_compute *c, struct tsr_tensor *dst, enum row_map m) {
  const struct tsr_tensor *a = dst->src[0];
  const int64_t ne0 = dst->ne[0];
  const float p = tsr_param_f32(dst, 0);
  int64_t lo, hi;
  tsr_cpu_split(c, tsr_tensor_nrows(dst), &lo, &hi);
  for (int64_t r = lo; r < hi; r++) {
    int64_t i1, i2, i3;
    tsr_cpu_row_coords(dst, r, &i1, &i2, &i3);
    float *y = (float *)dst->data + r * ne0;
    tsr_cpu_load_row_f32(y, tsr_cpu_row_at(a, i1, i2, i3), a->nb[0], ne0);
    switch (m) {
    case MAP_SCALE:
      for (int64_t j = 0; j < ne0; j++) y[j] *= p;
      break;
    case MAP_UNARY:
      activate((enum tsr_unary_op)dst->op_params[0], y, ne0);
      break;
    case MAP_SOFTCAP: {
      const float inv = 1.0f / p;
      for (int64_t j = 0; j < ne0; j++) y[j] = p * tanhf(y[j] * inv);
      break;
    }
    }
  }
}

TSR_CPU_KERNEL(scale) { map_rows(c, dst, MAP_SCALE); }
TSR_CPU_KERNEL(unary) { map_rows(c, dst, MAP_UNARY); }
TSR_CPU_KERNEL(softcap) { map_rows(c, dst, MAP_SOFTCAP); }

/* ---- glu ---------------------------------------------------------------- */

/* op(gate) * up. The separate form reads gate from src0 and up from src1;
** the fused form reads both halves of src0's row, [gate | up] or, when
** swapped, [up | gate]. swapped only names the fused layout: two separate
** tensors already say which is which. */
TSR_CPU_KERNEL(glu) {
  const struct tsr_tensor *a = dst->src[0], *u = dst->src[1];
  const int64_t ne0 = dst->ne[0];
  const bool swapped = dst->op_params[1] != 0;
  enum tsr_unary_op act = TSR_UNARY_SILU;
  switch ((enum tsr_glu_op)dst->op_params[0]) {
  case TSR_GLU_SWIGLU: act = TSR_UNARY_SILU; break;
  case TSR_GLU_GEGLU: act = TSR_UNARY_GELU; break;
  case TSR_GLU_REGLU: act = TSR_UNARY_RELU; break;
  case TSR_GLU_COUNT: break; /* the builder refuses it */
  }
  const int64_t gate_off = !u && swapped ? ne0 : 0;
  const int64_t up_off = u ? 0 : (swapped ? 0 : ne0);
  const struct tsr_tensor *up_t = u ? u : a;
  int64_t lo, hi;
  tsr_cpu_split(c, tsr_tensor_nrows(dst), &lo, &hi);
  for (int64_t r = lo; r < hi; r++) {
    int64_t i1, i2, i3;
    tsr_cpu_row_coords(dst, r, &i1, &i2, &i3);
    float *y = (float *)dst->data + r * ne0;
    tsr_cpu_load_row_f32(y, tsr_cpu_row_at(a, i1, i2, i3) + gate_off * (int64_t)a->nb[0], a->nb[0], ne0);
    activate(act, y, ne0);
    const size_t us = up_t->nb[0];
    const char *ur = tsr_cpu_row_at(up_t, i1, i2, i3) + up_off * (int64_t)us;
    for (int64_t j = 0; j < ne0; j++) y[j] *= tsr_cpu_load_f32(ur, us, j);
  }
}
