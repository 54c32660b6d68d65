/*
** GGUF block types, part 2: the k-quants. A super-block holds 256 values in sub-blocks of
** 16 (q2_K q3_K q6_K) or 32 (q4_K q5_K) values, each sub-block with its own quantized scale
** (and min); q8_K is the 8-bit super-block used for activations. See quant.c for where the
** layouts come from and the error bounds the tests hold them to.
**
** The quantizers follow ggml's reference ones exactly, including the per-sub-block scale
** searches, so the bytes match llama.cpp's. Their float arithmetic is written in the same
** order as ggml's on purpose: reordering a sum would change bytes in rare blocks.
*/
#include <math.h>
#include <string.h>

#include "graph/quant_blocks.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#define NSB16 (TSR_QK_K / 16)
#define NSB32 (TSR_QK_K / 32)

/* Below this a group counts as all zero (ggml's GROUP_MAX_EPS). */
#define GROUP_EPS 1e-15f

/* Round to nearest, ties to even: adding 1.5 * 2^23 leaves the rounded integer in the low
** mantissa bits. Meant for |v| < 2^22; like ggml we let larger values come out wrong and
** clamp them afterwards, since the bytes must match ggml's even then. */
static inline int round_int(float v) {
  float t = v + 12582912.f;
  int32_t i;
  memcpy(&i, &t, sizeof i);
  return (i & 0x007fffff) - 0x00400000;
}

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* ---- scale searches ------------------------------------------------------------------- */

/* Symmetric codes L[i] in [0, 2*nmax) for x ~ scale * (L[i] - nmax), weighting errors by x^2;
** tries 18 scales around nmax/max and keeps the best least-squares fit (q6_K). */
static float fit_symmetric(int n, int nmax, const float *x, int8_t *L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; i++) {
    if (fabsf(x[i]) > amax) {
      amax = fabsf(x[i]);
      max = x[i];
    }
  }
  if (amax < GROUP_EPS) {
    memset(L, 0, (size_t)n);
    return 0.f;
  }
  float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; i++) {
    int l = clampi(round_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = (int8_t)(l + nmax);
    float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; is++) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; i++) {
      int l = clampi(round_int(iscale * x[i]), -nmax, nmax - 1);
      float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; i++)
        L[i] = (int8_t)(nmax + clampi(round_int(iscale * x[i]), -nmax, nmax - 1));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

/* Symmetric codes as above, refined by moving single codes while the x^2-weighted fit
** improves (q3_K). */
static float fit_symmetric_refine(int n, int nmax, const float *x, int8_t *L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; i++) {
    if (fabsf(x[i]) > amax) {
      amax = fabsf(x[i]);
      max = x[i];
    }
  }
  if (amax < GROUP_EPS) {
    memset(L, 0, (size_t)n);
    return 0.f;
  }
  float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; i++) {
    int l = clampi(round_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = (int8_t)l;
    float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  for (int pass = 0; pass < 5; pass++) {
    int changed = 0;
    for (int i = 0; i < n; i++) {
      float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * L[i];
      if (!(slx > 0)) continue; /* written so a NaN skips, as in ggml */
      float sl2 = suml2 - w * L[i] * L[i];
      int nl = clampi(round_int(x[i] * sl2 / slx), -nmax, nmax - 1);
      if (nl == L[i]) continue;
      slx += w * x[i] * nl;
      sl2 += w * nl * nl;
      if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
        L[i] = (int8_t)nl;
        sumlx = slx;
        suml2 = sl2;
        changed++;
      }
    }
    if (!changed) break;
  }
  for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Affine codes L[i] in [0, nmax] for x ~ scale * L[i] - min (min >= 0 returned in *the_min):
** starts from the range fit, then tries nstep+1 grid scales, solving weighted least squares
** for scale and min at each, and keeps the one with the smallest weighted error (absolute
** error if use_mad, else squared). */
static float fit_affine(int n, int nmax, const float *x, const float *w, uint8_t *L,
                        float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
                        int use_mad) {
  float min = x[0], max = x[0];
  float sum_w = w[0], sum_x = sum_w * x[0];
  for (int i = 1; i < n; i++) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    memset(L, 0, (size_t)n);
    *the_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; i++) {
    L[i] = (uint8_t)clampi(round_int(iscale * (x[i] - min)), 0, nmax);
    float diff = scale * L[i] + min - x[i];
    diff = use_mad ? fabsf(diff) : diff * diff;
    best_error += w[i] * diff;
  }
  for (int is = 0; is <= nstep; is++) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; i++) {
      int l = clampi(round_int(iscale * (x[i] - min)), 0, nmax);
      Laux[i] = (uint8_t)l;
      sum_l += w[i] * l;
      sum_l2 += w[i] * l * l;
      sum_xl += w[i] * l * x[i];
    }
    float D = sum_w * sum_l2 - sum_l * sum_l;
    if (!(D > 0)) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
    if (this_min > 0) {
      this_min = 0;
      this_scale = sum_xl / sum_l2;
    }
    float err = 0;
    for (int i = 0; i < n; i++) {
      float diff = this_scale * Laux[i] + this_min - x[i];
      diff = use_mad ? fabsf(diff) : diff * diff;
      err += w[i] * diff;
    }
    if (err < best_error) {
      memcpy(L, Laux, (size_t)n);
      best_error = err;
      scale = this_scale;
      min = this_min;
    }
  }
  *the_min = -min;
  return scale;
}

/* ---- q2_K: x = d*sc*q - dmin*m per 16 values; scales[j] = sc | m << 4; the 2-bit code of
** element 128*h + 32*s + l is bits 2s..2s+1 of qs[32*h + l] ---- */

void tsr_dequantize_row_q2_K(const void *src, float *dst, int64_t n) {
  const struct tsr_block_q2_K *b = src;
  for (int64_t i = 0; i < n / TSR_QK_K; i++, b++) {
    float d = tsr_f16_to_f32(b->d), dmin = tsr_f16_to_f32(b->dmin);
    for (int e = 0; e < TSR_QK_K; e++) {
      int sub = e / 16, shift = 2 * ((e / 32) % 4);
      uint8_t sc = b->scales[sub];
      float dl = d * (sc & 0x0f), ml = dmin * (sc >> 4);
      int q = (b->qs[32 * (e / 128) + e % 32] >> shift) & 3;
      *dst++ = dl * q - ml;
    }
  }
}

void tsr_quantize_row_q2_K_ref(const float *src, void *dst, int64_t n) {
  struct tsr_block_q2_K *b = dst;
  uint8_t L[TSR_QK_K], Laux[16];
  float w[16], mins[NSB16], scales[NSB16];
  for (int64_t i = 0; i < n / TSR_QK_K; i++, b++, src += TSR_QK_K) {
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < NSB16; j++) {
      for (int l = 0; l < 16; l++) w[l] = fabsf(src[16 * j + l]);
      scales[j] = fit_affine(16, 3, src + 16 * j, w, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f,
                             15, 1);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    /* Sub-block scales and mins are 4-bit multiples of the block's d and dmin. */
    memset(b->scales, 0, sizeof b->scales);
    b->d = b->dmin = 0;
    if (max_scale > 0) {
      float iscale = 15.f / max_scale;
      for (int j = 0; j < NSB16; j++) b->scales[j] = (uint8_t)round_int(iscale * scales[j]);
      b->d = tsr_f32_to_f16(max_scale / 15.f);
    }
    if (max_min > 0) {
      float iscale = 15.f / max_min;
      for (int j = 0; j < NSB16; j++)
        b->scales[j] |= (uint8_t)((unsigned)round_int(iscale * mins[j]) << 4);
      b->dmin = tsr_f32_to_f16(max_min / 15.f);
    }
    /* Requantize against the scales as stored, so rounding them is compensated. */
    for (int j = 0; j < NSB16; j++) {
      float d = tsr_f16_to_f32(b->d) * (b->scales[j] & 0x0f);
      if (!d) continue;
      float dm = tsr_f16_to_f32(b->dmin) * (b->scales[j] >> 4);
      for (int l = 0; l < 16; l++)
        L[16 * j + l] = (uint8_t)clampi(round_int((src[16 * j + l] + dm) / d), 0, 3);
    }
    for (int h = 0; h < 2; h++)
      for (int l = 0; l < 32; l++) {
        const uint8_t *q = L + 128 * h + l;
        b->qs[32 * h + l] = (uint8_t)(q[0] | q[32] << 2 | q[64] << 4 | q[96] << 6);
      }
  }
}

/* ---- q3_K: x = d*(sc-32)*(q-4) per 16 values. q's low two bits sit like q2_K's; its third
** bit is bit e/32 of hmask[e%32], and a clear bit means "subtract 4". The 16 six-bit scales:
** low nibbles of j<8 in scales[j] low, of j>=8 in scales[j-8] high; the top two bits of
** scale j at bits 2*(j/4) of scales[8 + j%4] ---- */

void tsr_dequantize_row_q3_K(const void *src, float *dst, int64_t n) {
  const struct tsr_block_q3_K *b = src;
  for (int64_t i = 0; i < n / TSR_QK_K; i++, b++) {
    float d_all = tsr_f16_to_f32(b->d);
    for (int sub = 0; sub < NSB16; sub++) {
      float dl = d_all * tsr_q3_K_scale(b->scales, sub);
      for (int k = 0; k < 16; k++) {
        int e = 16 * sub + k, shift = 2 * ((e / 32) % 4);
        int q = (b->qs[32 * (e / 128) + e % 32] >> shift) & 3;
        int h = (b->hmask[e % 32] >> (e / 32)) & 1;
        *dst++ = dl * (q - (h ? 0 : 4));
      }
    }
  }
}

void tsr_quantize_row_q3_K_ref(const float *src, void *dst, int64_t n) {
  struct tsr_block_q3_K *b = dst;
  int8_t L[TSR_QK_K];
  float scales[NSB16];
  for (int64_t i = 0; i < n / TSR_QK_K; i++, b++, src += TSR_QK_K) {
    float max_scale = 0, amax = 0;
    for (int j = 0; j < NSB16; j++) {
      scales[j] = fit_symmetric_refine(16, 4, src + 16 * j, L + 16 * j);
      if (fabsf(scales[j]) > amax) {
        amax = fabsf(scales[j]);
        max_scale = scales[j];
      }
    }
    memset(b->scales, 0, sizeof b->scales);
    b->d = 0;
    if (max_scale) {
      float iscale = -32.f / max_scale;
      for (int j = 0; j < NSB16; j++) {
        /* ggml narrows to int8 before clamping; in range here, but kept for identity. */
        int l = clampi((int8_t)round_int(iscale * scales[j]), -32, 31) + 32;
        if (j < 8)
          b->scales[j] = (uint8_t)(l & 0x0f);
        else
          b->scales[j - 8] |= (uint8_t)((l & 0x0f) << 4);
        b->scales[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
      }
      b->d = tsr_f32_to_f16(1 / iscale);
    }
    for (int j = 0; j < NSB16; j++) {
      float d = tsr_f16_to_f32(b->d) * tsr_q3_K_scale(b->scales, j);
      if (!d) continue;
      for (int l = 0; l < 16; l++)
        L[16 * j + l] = (int8_t)(clampi(round_int(src[16 * j + l] / d), -4, 3) + 4);
    }
    memset(b->hmask, 0, sizeof b->hmask);
    for (int e = 0; e < TSR_QK_K; e++) {
      if (L[e] > 3) {
        b->hmask[e % 32] |= (uint8_t)(1u << (e / 32));
        L[e] -= 4;
      }
    }
    for (int h = 0; h < 2; h++)
      for (int l = 0; l < 32; l++) {
        const int8_t *q = L + 128 * h + l;
        b->qs[32 * h + l] = (uint8_t)(q[0] | q[32] << 2 | q[64] << 4 | q[96] << 6);
      }
  }
}

/* ---- q4_K / q5_K: x = d*sc*q - dmin*m per 32 values, 6-bit sc and m packed in 12 bytes:
** for j<4, sc = s[j] & 63 and m = s[j+4] & 63; for j>=4, sc's low nibble is s[j+4]'s low
** nibble and its top two bits the top two of s[j-4]; m's low nibble is s[j+4]'s high nibble
** and its top two bits the top two of s[j] ---- */

static void k4_scale_get(const uint8_t s[12], int j, int *sc, int *m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0f) | (s[j - 4] >> 6) << 4;
    *m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
  }
}

/* Shared first half of q4_K and q5_K quantization: fits each 32-value sub-block, stores the
** packed scales, d and dmin, and leaves the codes (0..nmax) in L. */
static void k4_fit_block(const float *x, int nmax, float rmin, int nstep, uint8_t scales_out[12],
                         uint16_t *d_out, uint16_t *dmin_out, uint8_t L[TSR_QK_K]) {
  uint8_t Laux[32];
  float w[32], mins[NSB32], scales[NSB32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < NSB32; j++) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
    float av_x = sqrtf(sum_x2 / 32);
    for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(x[32 * j + l]);
    scales[j] = fit_affine(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], Laux, rmin, 0.1f,
                           nstep, 0);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t *s = scales_out;
  memset(s, 0, 12);
  for (int j = 0; j < NSB32; j++) {
    /* ggml narrows to uint8 and then caps at 63. */
    uint8_t ls = (uint8_t)round_int(inv_scale * scales[j]);
    uint8_t lm = (uint8_t)round_int(inv_min * mins[j]);
    if (ls > 63) ls = 63;
    if (lm > 63) lm = 63;
    if (j < 4) {
      s[j] = ls;
      s[j + 4] = lm;
    } else {
      s[j + 4] = (uint8_t)((ls & 0x0f) | (lm & 0x0f) << 4);
      s[j - 4] |= (uint8_t)((ls >> 4) << 6);
      s[j] |= (uint8_t)((lm >> 4) << 6);
    }
  }
  *d_out = tsr_f32_to_f16(max_scale / 63.f);
  *dmin_out = tsr_f32_to_f16(max_min / 63.f);
  for (int j = 0; j < NSB32; j++) {
    int sc, m;
    k4_scale_get(s, j, &sc, &m);
    float d = tsr_f16_to_f32(*d_out) * sc;
    if (!d) continue;
    float dm = tsr_f16_to_f32(*dmin_out) * m;
    for (int l = 0; l < 32; l++)
      L[32 * j + l] = (uint8_t)clampi(round_int((x[32 * j + l] + dm) / d), 0, nmax);
  }
}

/* q4_K codes: element 64*c + l in the low nibble of qs[32*c + l], 64*c + 32 + l in the high. */
void tsr_dequantize_row_q4_K(const void *src, float *dst, int64_t n) {
  const struct tsr_block_q4_K *b = src;
  for (int64_t i = 0; i < n / TSR_QK_K; i++, b++) {
    float d = tsr_f16_to_f32(b->d), dmin = tsr_f16_to_f32(b->dmin);
    for (int sub = 0; sub < NSB32; sub++) {
      int sc, m;
      k4_scale_get(b->scales, sub, &sc, &m);
      float dl = d * sc, ml = dmin * m;
      const uint8_t *q = b->qs + 32 * (sub / 2);
      int shift = 4 * (sub % 2);
      for (int l = 0; l < 32; l++) *dst++ = dl * ((q[l] >> shift) & 0x0f) - ml;
    }
  }
}

void tsr_quantize_row_q4_K_ref(const float *src, void *dst, int64_t n) {
  struct tsr_block_q4_K *b = dst;
  uint8_t L[TSR_QK_K];
  for (int64_t i = 0; i < n / TSR_QK_K; i++, b++, src += TSR_QK_K) {
    k4_fit_block(src, 15, -1.f, 20, b->scales, &b->d, &b->dmin, L);
    for (int c = 0; c < 4; c++)
      for (int l = 0; l < 32; l++)
        b->qs[32 * c + l] = (uint8_t)(L[64 * c + l] | L[64 * c + 32 + l] << 4);
  }
}

/* q5_K codes: low four bits as q4_K; the fifth bit of element e is bit e/32 of qh[e%32]. */
void tsr_dequantize_row_q5_K(const void *src, float *dst, int64_t n) {
  const struct tsr_block_q5_K *b = src;
  for (int64_t i = 0; i < n / TSR_QK_K; i++, b++) {
    float d = tsr_f16_to_f32(b->d), dmin = tsr_f16_to_f32(b->dmin);
    for (int sub = 0; sub < NSB32; sub++) {
      int sc, m;
      k4_scale_get(b->scales, sub, &sc, &m);
      float dl = d * sc, ml = dmin * m;
      const uint8_t *q = b->qs + 32 * (sub / 2);
      int shift = 4 * (sub % 2);
      for (int l = 0; l < 32; l++) {
        int v = ((q[l] >> shift) & 0x0f) | ((b->qh[l] >> sub) & 1) << 4;
        *dst++ = dl * v - ml;
      }
    }
  }
}

void tsr_quantize_row_q5_K_ref(const float *src, void *dst, int64_t n) {
  struct tsr_block_q5_K *b = dst;
  uint8_t L[TSR_QK_K];
  for (int64_t i = 0; i < n / TSR_QK_K; i++, b++, src += TSR_QK_K) {
    k4_fit_block(src, 31, -0.5f, 15, b->scales, &b->d, &b->dmin, L);
    memset(b->qh, 0, sizeof b->qh);
    for (int e = 0; e < TSR_QK_K; e++)
      if (L[e] > 15) b->qh[e % 32] |= (uint8_t)(1u << (e / 32));
    for (int c = 0; c < 4; c++)
      for (int l = 0; l < 32; l++)
        b->qs[32 * c + l] = (uint8_t)((L[64 * c + l] & 0x0f) | (L[64 * c + 32 + l] & 0x0f) << 4);
  }
}

/* ---- q6_K: x = d*sc*(q-32) per 16 values, sc a signed byte. In each half h (128 values),
** element 128h + 32k + l has its low nibble in ql[64h + l + 32*(k&1)] (low for k<2, high
** for k>=2) and its top two bits at bits 2k of qh[32h + l] ---- */

void tsr_dequantize_row_q6_K(const void *src, float *dst, int64_t n) {
  const struct tsr_block_q6_K *b = src;
  for (int64_t i = 0; i < n / TSR_QK_K; i++, b++) {
    float d = tsr_f16_to_f32(b->d);
    for (int e = 0; e < TSR_QK_K; e++) {
      int h = e / 128, k = (e % 128) / 32, l = e % 32;
      int lo = (b->ql[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 0x0f;
      int hi = (b->qh[32 * h + l] >> (2 * k)) & 3;
      *dst++ = d * b->scales[e / 16] * ((lo | hi << 4) - 32);
    }
  }
}

void tsr_quantize_row_q6_K_ref(const float *src, void *dst, int64_t n) {
  struct tsr_block_q6_K *b = dst;
  int8_t L[TSR_QK_K];
  float scales[NSB16];
  for (int64_t i = 0; i < n / TSR_QK_K; i++, b++, src += TSR_QK_K) {
    float max_scale = 0, max_abs = 0;
    for (int j = 0; j < NSB16; j++) {
      scales[j] = fit_symmetric(16, 32, src + 16 * j, L + 16 * j);
      if (fabsf(scales[j]) > max_abs) {
        max_abs = fabsf(scales[j]);
        max_scale = scales[j];
      }
    }
    if (max_abs < GROUP_EPS) {
      memset(b, 0, sizeof *b);
      continue;
    }
    float iscale = -128.f / max_scale;
    b->d = tsr_f32_to_f16(1 / iscale);
    for (int j = 0; j < NSB16; j++) {
      int v = round_int(iscale * scales[j]);
      b->scales[j] = (int8_t)(v < 127 ? v : 127);
    }
    for (int j = 0; j < NSB16; j++) {
      float d = tsr_f16_to_f32(b->d) * b->scales[j];
      if (!d) continue;
      for (int l = 0; l < 16; l++)
        L[16 * j + l] = (int8_t)(clampi(round_int(src[16 * j + l] / d), -32, 31) + 32);
    }
    for (int h = 0; h < 2; h++)
      for (int l = 0; l < 32; l++) {
        const int8_t *q = L + 128 * h + l; /* q[32*k] is element 128h + 32k + l */
        b->ql[64 * h + l] = (uint8_t)((q[0] & 0x0f) | (q[64] & 0x0f) << 4);
        b->ql[64 * h + 32 + l] = (uint8_t)((q[32] & 0x0f) | (q[96] & 0x0f) << 4);
        b->qh[32 * h + l] =
            (uint8_t)(q[0] >> 4 | (q[32] >> 4) << 2 | (q[64] >> 4) << 4 | (q[96] >> 4) << 6);
      }
  }
}

/* ---- q8_K: x = d * q with a float d; bsums[j] = sum of the 16 codes of sub-block j ---- */

void tsr_dequantize_row_q8_K(const void *src, float *dst, int64_t n) {
  const struct tsr_block_q8_K *b = src;
  for (int64_t i = 0; i < n / TSR_QK_K; i++, b++)
    for (int e = 0; e < TSR_QK_K; e++) *dst++ = b->d * b->qs[e];
}

void tsr_quantize_row_q8_K_ref(const float *src, void *dst, int64_t n) {
  struct tsr_block_q8_K *b = dst;
  for (int64_t i = 0; i < n / TSR_QK_K; i++, b++, src += TSR_QK_K) {
    float max = 0, amax = 0;
    for (int e = 0; e < TSR_QK_K; e++) {
      if (fabsf(src[e]) > amax) {
        amax = fabsf(src[e]);
        max = src[e];
      }
    }
    if (!amax) { /* ggml leaves bsums stale here; zero them so the block is well defined */
      memset(b, 0, sizeof *b);
      continue;
    }
    /* -127 rather than -128 keeps codes symmetric, which the q8_K dot kernels rely on. */
    float iscale = -127.f / max;
    for (int e = 0; e < TSR_QK_K; e++) {
      int v = round_int(iscale * src[e]);
      b->qs[e] = (int8_t)(v < 127 ? v : 127);
    }
    for (int j = 0; j < NSB16; j++) {
      int sum = 0;
      for (int l = 0; l < 16; l++) sum += b->qs[16 * j + l];
      b->bsums[j] = (int16_t)sum;
    }
    b->d = 1 / iscale;
  }
}
