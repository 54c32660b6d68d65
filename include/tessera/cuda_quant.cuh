/*
** Device-side element access for every dtype the CUDA backend reads, and the
** block quantizers it writes (cpy, set_rows: the KV codecs). Public so that a
** plugin's CUDA kernels read the scalar KV tiers in place the way the core's
** flash kernel does (dq_rt).
**
** Layouts are core/graph/quant_blocks.h and core/graph/quant.c / quant_k.c byte for byte;
** offsets are spelled out here because the C header's _Static_asserts are not
** C++. Dequantizers repeat the CPU's arithmetic order (scale products first),
** quantizers repeat it with explicit round-to-nearest operations so no fused
** multiply-add changes a code: the device writes the bytes the CPU writes.
** Half scales are read byte by byte: blocks of 18, 22 or 26 bytes leave them
** only 2-byte aligned and a view may start anywhere a block does.
*/
#ifndef TSR_CUDA_QUANT_CUH
#define TSR_CUDA_QUANT_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Host and device both: core/cuda/tests/test_cuda_quant.cu runs these on the
** CPU against core/graph/quant.c, so the layouts are checked where CI runs. */
#define CU_HD __host__ __device__

/* Round-to-nearest arithmetic that no compiler may fuse (the host side is
** compiled without FMA contraction for x86-64's baseline). */
#ifdef __CUDA_ARCH__
#define RN_MUL(a, b) __fmul_rn(a, b)
#define RN_ADD(a, b) __fadd_rn(a, b)
#define RN_SUB(a, b) __fsub_rn(a, b)
#define RN_DIV(a, b) __fdiv_rn(a, b)
#else
#define RN_MUL(a, b) ((float)(a) * (float)(b))
#define RN_ADD(a, b) ((float)(a) + (float)(b))
#define RN_SUB(a, b) ((float)(a) - (float)(b))
#define RN_DIV(a, b) ((float)(a) / (float)(b))
#endif

CU_HD static inline float u2f(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}

CU_HD static inline uint32_t f2u(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
#endif
}

/* The core's dtype ids (core/graph/dtype.h), as device constants. */
enum {
  T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
  T_Q2_K = 10, T_Q3_K = 11, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_Q8_K = 15,
  T_I32 = 26, T_BF16 = 30, T_Q6_0 = 1000,
};

CU_HD static inline constexpr int cu_block_size(int t) {
  switch (t) {
  case T_Q4_0: case T_Q4_1: case T_Q5_0: case T_Q5_1: case T_Q8_0: case T_Q6_0: return 32;
  case T_Q2_K: case T_Q3_K: case T_Q4_K: case T_Q5_K: case T_Q6_K: case T_Q8_K: return 256;
  default: return 1;
  }
}

CU_HD static inline constexpr int cu_block_bytes(int t) {
  switch (t) {
  case T_F32: case T_I32: return 4;
  case T_F16: case T_BF16: return 2;
  case T_Q4_0: return 18;
  case T_Q4_1: return 20;
  case T_Q5_0: return 22;
  case T_Q5_1: return 24;
  case T_Q8_0: return 34;
  case T_Q6_0: return 26;
  case T_Q2_K: return 84;
  case T_Q3_K: return 110;
  case T_Q4_K: return 144;
  case T_Q5_K: return 176;
  case T_Q6_K: return 210;
  case T_Q8_K: return 292;
  default: return 0;
  }
}

/* i / n (returned) and i % n (*r) for the small non-negative ints of a kernel's index
** math: a shift and a mask when n is a power of two (every head dim and block count a
** model here has), else one 32-bit division, never the 64-bit one an int64_t index costs. */
CU_HD static inline int cu_divmod(int i, int n, int *r) {
  if ((n & (n - 1)) == 0) {
#ifdef __CUDA_ARCH__
    const int s = __ffs(n) - 1;
#else
    const int s = __builtin_ctz((unsigned)n);
#endif
    *r = i & (n - 1);
    return i >> s;
  }
  const int q = i / n;
  *r = i - q * n;
  return q;
}

CU_HD static inline float ld_h(const uint8_t *p) {
  return __half2float(__ushort_as_half((unsigned short)(p[0] | p[1] << 8)));
}

CU_HD static inline float bf16_f(uint16_t h) { return u2f((uint32_t)h << 16); }

/* k-quant 6-bit scale and min of sub-block j (q4_K, q5_K). */
CU_HD static inline void k4_scale(const uint8_t *s, int j, int *sc, int *m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0f) | (s[j - 4] >> 6) << 4;
    *m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
  }
}

/* Element i of a row of block type T starting at row (plain types: packed). */
template <int T>
CU_HD static inline float dq(const uint8_t *row, int64_t i) {
  if (T == T_F32) return reinterpret_cast<const float *>(row)[i];
  if (T == T_F16) return __half2float(reinterpret_cast<const __half *>(row)[i]);
  if (T == T_BF16) return bf16_f(reinterpret_cast<const uint16_t *>(row)[i]);
  const int bs = cu_block_size(T);
  const uint8_t *b = row + (i / bs) * cu_block_bytes(T);
  const int e = (int)(i % bs);
  if (T == T_Q4_0) {
    const int q = e < 16 ? b[2 + e] & 0x0f : b[2 + e - 16] >> 4;
    return (float)(q - 8) * ld_h(b);
  }
  if (T == T_Q4_1) {
    const int q = e < 16 ? b[4 + e] & 0x0f : b[4 + e - 16] >> 4;
    return (float)q * ld_h(b) + ld_h(b + 2);
  }
  if (T == T_Q5_0 || T == T_Q5_1) {
    const int o = T == T_Q5_0 ? 2 : 4; /* qh follows d (and m) */
    const uint32_t qh = b[o] | b[o + 1] << 8 | b[o + 2] << 16 | (uint32_t)b[o + 3] << 24;
    const int lo = e < 16 ? b[o + 4 + e] & 0x0f : b[o + 4 + e - 16] >> 4;
    const int q = lo | (int)((qh >> e) & 1) << 4;
    if (T == T_Q5_0) return (float)(q - 16) * ld_h(b);
    return (float)q * ld_h(b) + ld_h(b + 2);
  }
  if (T == T_Q8_0) return (float)(int8_t)b[2 + e] * ld_h(b);
  if (T == T_Q6_0) {
    const int lo = e < 16 ? b[2 + e] & 0x0f : b[2 + e - 16] >> 4;
    const int hi = (b[18 + e % 8] >> (2 * (e / 8))) & 3;
    return (float)((lo | hi << 4) - 32) * ld_h(b);
  }
  if (T == T_Q2_K) { /* scales[16] qs[64] d dmin */
    const uint8_t sc = b[e / 16];
    const float dl = ld_h(b + 80) * (sc & 0x0f), ml = ld_h(b + 82) * (sc >> 4);
    const int q = (b[16 + 32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
    return dl * q - ml;
  }
  if (T == T_Q3_K) { /* hmask[32] qs[64] scales[12] d */
    const uint8_t *s = b + 96;
    const int j = e / 16;
    const int lo = j < 8 ? s[j] & 0x0f : s[j - 8] >> 4;
    const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    const float dl = ld_h(b + 108) * ((lo | hi << 4) - 32);
    const int q = (b[32 + 32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
    const int h = (b[e % 32] >> (e / 32)) & 1;
    return dl * (q - (h ? 0 : 4));
  }
  if (T == T_Q4_K || T == T_Q5_K) { /* d dmin scales[12] (qh[32]) qs[128] */
    const int sub = e / 32;
    int sc, m;
    k4_scale(b + 4, sub, &sc, &m);
    const float dl = ld_h(b) * sc, ml = ld_h(b + 2) * m;
    const uint8_t *qs = b + (T == T_Q4_K ? 16 : 48);
    int v = (qs[32 * (sub / 2) + e % 32] >> (4 * (sub % 2))) & 0x0f;
    if (T == T_Q5_K) v |= ((b[16 + e % 32] >> sub) & 1) << 4;
    return dl * v - ml;
  }
  if (T == T_Q6_K) { /* ql[128] qh[64] scales[16] d */
    const int h = e / 128, k = (e % 128) / 32, l = e % 32;
    const int lo = (b[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 0x0f;
    const int hi = (b[128 + 32 * h + l] >> (2 * k)) & 3;
    return ld_h(b + 208) * (int8_t)b[192 + e / 16] * ((lo | hi << 4) - 32);
  }
  if (T == T_Q8_K) {
    const uint32_t d = b[0] | b[1] << 8 | b[2] << 16 | (uint32_t)b[3] << 24;
    return u2f(d) * (int8_t)b[4 + e];
  }
  return 0.0f;
}

/* Weights [32c + 8p, 32c + 8p + 8) of a row of block type T (p < 4): a quarter
** of 32-weight chunk c with a few wide loads and one scale, the same values as
** dq<T> element by element. q4_0, q8_0, q6_K and q4_K (with wide: rows 4-byte
** aligned) have their own paths; the rest go through dq. The CUDA gemv deals
** these quarters to the lanes so a warp step reads 256 contiguous weights. */
template <int T>
CU_HD static inline void dq_part8(const uint8_t *row, int64_t c, int p, float w[8], int wide) {
  if (T == T_Q4_0) { /* d qs[16]: weight i < 16 the low nibble of qs[i], i + 16 the high */
    const uint8_t *b = row + c * 18;
    const float d = ld_h(b);
    const uint8_t *qs = b + 2 + 8 * (p & 1);
    const int sh = 4 * (p >> 1);
    for (int i = 0; i < 4; i++) {
      const uint32_t u = (uint32_t)*reinterpret_cast<const uint16_t *>(qs + 2 * i) >> sh;
      w[2 * i] = (float)((int)(u & 15) - 8) * d, w[2 * i + 1] = (float)((int)(u >> 8 & 15) - 8) * d;
    }
  } else if (T == T_Q8_0) {
    const uint8_t *b = row + c * 34;
    const float d = ld_h(b);
    for (int i = 0; i < 4; i++) {
      const uint32_t u = *reinterpret_cast<const uint16_t *>(b + 2 + 8 * p + 2 * i);
      w[2 * i] = (float)(int8_t)(u & 255) * d, w[2 * i + 1] = (float)(int8_t)(u >> 8) * d;
    }
  } else if (T == T_Q4_K && wide) { /* d dmin scales[12] qs[128]; chunk = sub-block c % 8 */
    const uint8_t *b = row + c / 8 * 144;
    const int j = (int)(c % 8);
    int sc, m;
    k4_scale(b + 4, j, &sc, &m);
    const float dl = ld_h(b) * sc, ml = ld_h(b + 2) * m;
    const uint8_t *qs = b + 16 + 32 * (j / 2) + 8 * p;
    for (int i = 0; i < 2; i++) {
      const uint32_t u = *reinterpret_cast<const uint32_t *>(qs + 4 * i) >> (4 * (j % 2));
      for (int k = 0; k < 4; k++) w[4 * i + k] = dl * (float)(u >> (8 * k) & 15) - ml;
    }
  } else if (T == T_Q6_K) { /* ql[128] qh[64] scales[16] d; chunk = 32 of 256 */
    const uint8_t *b = row + c / 8 * 210;
    const int cc = (int)(c % 8), h = cc / 4, k = cc % 4;
    const uint8_t *ql = b + 64 * h + 32 * (k & 1) + 8 * p, *qh = b + 128 + 32 * h + 8 * p;
    const int sl = 4 * (k >> 1), shh = 2 * k;
    const float s = ld_h(b + 208) * (float)(int8_t)b[192 + 8 * h + 2 * k + (p >> 1)];
    for (int i = 0; i < 4; i++) {
      const uint32_t lo = (uint32_t)*reinterpret_cast<const uint16_t *>(ql + 2 * i) >> sl;
      const uint32_t hi = (uint32_t)*reinterpret_cast<const uint16_t *>(qh + 2 * i) >> shh;
      for (int e = 0; e < 2; e++)
        w[2 * i + e] = s * (float)((int)((lo >> (8 * e) & 15) | (hi >> (8 * e) & 3) << 4) - 32);
    }
  } else {
    for (int e = 0; e < 8; e++) w[e] = dq<T>(row, c * 32 + 8 * p + e);
  }
}

/* ---- 8-bit x and integer dots: the decode GEMV's q8 path ----------------------- */

/* x is quantized once per product in blocks of 32: q = round(x / d) with
** d = max |x| / 127 kept in f32 (not rounded to a half), and the block's sum of q.
** A chunk of 32 weights then dots with it in integers (four bytes at a time) and
** one or two float scales. The host runs the same functions in
** core/cuda/tests/test_cuda_quant.cu, so the quantized x and every chunk's sum are
** checked on the CPU. */

/* The four signed bytes of a times those of b, summed into c (the GPU's dp4a). */
CU_HD static inline int dot4_i8(int a, int b, int c) {
#ifdef __CUDA_ARCH__
  return __dp4a(a, b, c);
#else
  for (int k = 0; k < 4; k++) c += (int)(int8_t)(a >> 8 * k) * (int)(int8_t)(b >> 8 * k);
  return c;
#endif
}

/* Each byte of a minus the same byte of b, wrapping (so codes 0..63 minus their
** offset become signed bytes). */
CU_HD static inline int sub4_u8(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
  return (int)__vsub4(a, b);
#else
  uint32_t r = 0;
  for (int k = 0; k < 4; k++) r |= (((a >> 8 * k) - (b >> 8 * k)) & 255u) << 8 * k;
  return (int)r;
#endif
}

/* Four bytes at p, which blocks of 18, 34 or 210 bytes leave only 2-byte aligned. */
CU_HD static inline uint32_t ld_u32_a2(const uint8_t *p) {
  const uint16_t *h = reinterpret_cast<const uint16_t *>(p);
  return (uint32_t)h[0] | (uint32_t)h[1] << 16;
}

/* __byte_perm, and its equal on the host (the CPU test of tsr_dq_quarter_h). */
CU_HD static inline uint32_t tsr_byte_perm(uint32_t x, uint32_t y, uint32_t sel) {
#ifdef __CUDA_ARCH__
  return __byte_perm(x, y, sel);
#else
  const uint64_t v = (uint64_t)y << 32 | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; i++) r |= (uint32_t)(v >> (8 * (sel >> (4 * i) & 7)) & 255) << (8 * i);
  return r;
#endif
}

/* Two code bytes of x (bytes 0, 1: sel 0x5140; 2, 3: 0x5342), each placed under the f16
** exponent of 1024 (0x64uu is exactly 1024 + u), less bias and times d2: two f16 values
** q * d, each rounded once, as the bits of a half2 (the first in the low half). */
CU_HD static inline uint32_t tsr_codes_to_h2(uint32_t x, uint32_t sel, __half2 bias, __half2 d2) {
  const uint32_t u = tsr_byte_perm(x, 0x64646464u, sel);
  const __half2 v = __hmul2(__hsub2(__halves2half2(__ushort_as_half((unsigned short)(u & 0xffff)),
                                                   __ushort_as_half((unsigned short)(u >> 16))),
                                    bias),
                            d2);
  return (uint32_t)__half_as_ushort(__low2half(v)) | (uint32_t)__half_as_ushort(__high2half(v)) << 16;
}

/* Quarter p (values 8p .. 8p+7) of a q8_0 or q4_0 block as eight f16, straight from the
** codes: a code byte u placed under the f16 exponent of 1024 (0x64uu) is exactly 1024 + u,
** so one subtraction gives the integer q exactly, and one f16 product rounds q * d once, as
** __float2half_rn((float)q * d) does (that f32 product is exact: 8 bits times 11). The same
** bits as dq's values rounded to f16, in about two instructions a value where the int to
** float conversion alone runs at a quarter of the rate. */
template <int T>
CU_HD static inline uint4 tsr_dq_quarter_h(const uint8_t *b, int p) {
  const __half2 d2 = __half2half2(*reinterpret_cast<const __half *>(b));
  uint32_t w[2];
  __half2 bias;
  if (T == T_Q8_0) { /* d qs[32]; int8 codes, made 0..255 by flipping the sign bit */
    w[0] = ld_u32_a2(b + 2 + 8 * p) ^ 0x80808080u;
    w[1] = ld_u32_a2(b + 6 + 8 * p) ^ 0x80808080u;
    bias = __float2half2_rn(1024.0f + 128.0f);
  } else { /* q4_0: d qs[16]; value i < 16 the low nibble of qs[i], i + 16 the high */
    const int sh = 4 * (p >> 1);
    w[0] = ld_u32_a2(b + 2 + 8 * (p & 1)) >> sh & 0x0f0f0f0fu;
    w[1] = ld_u32_a2(b + 6 + 8 * (p & 1)) >> sh & 0x0f0f0f0fu;
    bias = __float2half2_rn(1024.0f + 8.0f);
  }
  return make_uint4(tsr_codes_to_h2(w[0], 0x5140, bias, d2), tsr_codes_to_h2(w[0], 0x5342, bias, d2),
                    tsr_codes_to_h2(w[1], 0x5140, bias, d2), tsr_codes_to_h2(w[1], 0x5342, bias, d2));
}

/* A block's scale from its largest magnitude, and the multiplier that codes a value.
** A NaN anywhere makes the block's scale NaN (x8_absmax keeps it), so the product
** is NaN as with f32 dots. */
CU_HD static inline float x8_absmax(float a, float b) { return a > b || a != a ? a : b; }
CU_HD static inline float x8_scale(float amax) { return RN_DIV(amax, 127.0f); }
/* 0 when 1 / d overflows: a block whose largest magnitude is under ~4e-37 codes as zeros
** (an error below that magnitude), never as x times infinity */
CU_HD static inline float x8_inv(float d) {
  const float inv = d != 0.0f ? RN_DIV(1.0f, d) : 0.0f;
  return inv < INFINITY ? inv : 0.0f;
}
CU_HD static inline int x8_code(float x, float inv) {
  const int q = (int)roundf(RN_MUL(x, inv));
  return q < -127 ? -127 : q > 127 ? 127 : q;
}

/* 32 values as codes q[32]; returns the scale, *sum the sum of the codes. */
CU_HD static inline float x8_block(const float *x, int8_t *q, int *sum) {
  float amax = 0.0f;
  for (int j = 0; j < 32; j++) amax = x8_absmax(fabsf(x[j]), amax);
  const float d = x8_scale(amax), inv = x8_inv(d);
  *sum = 0;
  for (int j = 0; j < 32; j++) q[j] = (int8_t)x8_code(x[j], inv), *sum += q[j];
  return d;
}

/* A chunk of 32 weights as 8 words of 4 bytes, in the order of the chunk's x
** codes, and its scales: q4_0, q8_0, q6_K signed codes (w = d q, d q, d s q);
** q4_K codes 0..15 (w = d q - m); q6_K's two 16-weight halves scale by s0, s1. */
struct x8_chunk {
  int q[8];
  float d, m;
  int s0, s1;
};

CU_HD static inline bool x8_supported(int t) {
  return t == T_Q4_0 || t == T_Q8_0 || t == T_Q4_K || t == T_Q6_K;
}

/* Chunk c (weights 32c .. 32c+31) of a row of block type T (x8_supported). */
template <int T>
CU_HD static inline void x8_decode(const uint8_t *row, int64_t c, struct x8_chunk *w) {
  if (T == T_Q4_0) { /* d qs[16]: weight i < 16 the low nibble of qs[i], i + 16 the high */
    const uint8_t *b = row + c * 18;
    w->d = ld_h(b);
    for (int i = 0; i < 4; i++) {
      const uint32_t u = ld_u32_a2(b + 2 + 4 * i);
      w->q[i] = sub4_u8(u & 0x0f0f0f0fu, 0x08080808u);
      w->q[4 + i] = sub4_u8(u >> 4 & 0x0f0f0f0fu, 0x08080808u);
    }
  } else if (T == T_Q8_0) {
    const uint8_t *b = row + c * 34;
    w->d = ld_h(b);
    for (int i = 0; i < 8; i++) w->q[i] = (int)ld_u32_a2(b + 2 + 4 * i);
  } else if (T == T_Q4_K) { /* d dmin scales[12] qs[128]; chunk = sub-block c % 8 */
    const uint8_t *b = row + c / 8 * 144;
    const int j = (int)(c % 8);
    int sc, m;
    k4_scale(b + 4, j, &sc, &m);
    w->d = ld_h(b) * sc, w->m = ld_h(b + 2) * m;
    const uint8_t *qs = b + 16 + 32 * (j / 2);
    for (int i = 0; i < 8; i++) w->q[i] = (int)(ld_u32_a2(qs + 4 * i) >> 4 * (j % 2) & 0x0f0f0f0fu);
  } else if (T == T_Q6_K) { /* ql[128] qh[64] scales[16] d; chunk = 32 of 256 */
    const uint8_t *b = row + c / 8 * 210;
    const int cc = (int)(c % 8), h = cc / 4, k = cc % 4;
    const uint8_t *ql = b + 64 * h + 32 * (k & 1), *qh = b + 128 + 32 * h;
    for (int i = 0; i < 8; i++) {
      const uint32_t lo = ld_u32_a2(ql + 4 * i) >> 4 * (k >> 1) & 0x0f0f0f0fu;
      const uint32_t hi = (ld_u32_a2(qh + 4 * i) >> 2 * k & 0x03030303u) << 4;
      w->q[i] = sub4_u8(lo | hi, 0x20202020u);
    }
    w->d = ld_h(b + 208);
    w->s0 = (int8_t)b[192 + 2 * cc], w->s1 = (int8_t)b[192 + 2 * cc + 1];
  }
}

/* The chunk's dot with an x block: codes xq (8 words), scale xd, code sum xs. */
template <int T>
CU_HD static inline float x8_dot(const struct x8_chunk *w, const int *xq, float xd, int xs) {
  int lo = 0, hi = 0;
  for (int i = 0; i < 4; i++) lo = dot4_i8(w->q[i], xq[i], lo);
  for (int i = 4; i < 8; i++) hi = dot4_i8(w->q[i], xq[i], hi);
  if (T == T_Q4_K) return xd * (w->d * (float)(lo + hi) - w->m * (float)xs);
  if (T == T_Q6_K) return xd * (w->d * (float)(w->s0 * lo + w->s1 * hi));
  return xd * (w->d * (float)(lo + hi));
}

/* Element i of a row of any readable type; plain types step nb0 bytes. Uniform
** branches: every thread of a launch reads one type. */
CU_HD static inline float dq_rt(int t, const char *row, int64_t i, int64_t nb0) {
  const uint8_t *r = reinterpret_cast<const uint8_t *>(row);
  switch (t) {
  case T_F32: return *reinterpret_cast<const float *>(row + i * nb0);
  case T_F16: return __half2float(*reinterpret_cast<const __half *>(row + i * nb0));
  case T_BF16: return bf16_f(*reinterpret_cast<const uint16_t *>(row + i * nb0));
  case T_Q4_0: return dq<T_Q4_0>(r, i);
  case T_Q4_1: return dq<T_Q4_1>(r, i);
  case T_Q5_0: return dq<T_Q5_0>(r, i);
  case T_Q5_1: return dq<T_Q5_1>(r, i);
  case T_Q8_0: return dq<T_Q8_0>(r, i);
  case T_Q6_0: return dq<T_Q6_0>(r, i);
  case T_Q2_K: return dq<T_Q2_K>(r, i);
  case T_Q3_K: return dq<T_Q3_K>(r, i);
  case T_Q4_K: return dq<T_Q4_K>(r, i);
  case T_Q5_K: return dq<T_Q5_K>(r, i);
  case T_Q6_K: return dq<T_Q6_K>(r, i);
  case T_Q8_K: return dq<T_Q8_K>(r, i);
  default: return 0.0f;
  }
}

/* ---- writing ------------------------------------------------------------- */

/* Two floats rounded to halves, as the 32 bits of a half2 (lo in the low half). */
__device__ static inline uint32_t cu_half2_bits(float lo, float hi) {
  const __half2 h = __halves2half2(__float2half_rn(lo), __float2half_rn(hi));
  return *reinterpret_cast<const uint32_t *>(&h);
}

/* The CPU's tsr_f32_to_bf16: round to nearest even, NaN kept quiet. */
CU_HD static inline uint16_t f_bf16(float f) {
  const uint32_t x = f2u(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
  return (uint16_t)((x + (0x7fffu + ((x >> 16) & 1u))) >> 16);
}

/* The CPU's tsr_f32_to_f16 in integer operations: round to nearest even,
** overflow to inf, subnormals rounded, NaN kept quiet. */
CU_HD static inline uint32_t f_h16(float f) {
  const uint32_t x = f2u(f), sign = (x >> 16) & 0x8000u, man = x & 0x7fffffu;
  const int32_t e = (int32_t)((x >> 23) & 0xffu) - 127 + 15;
  if (e == 128 + 15) return sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0u);
  if (e >= 31) return sign | 0x7c00u;
  if (e <= 0) {
    if (e < -10) return sign;
    const uint32_t m = man | 0x800000u, shift = (uint32_t)(14 - e);
    const uint32_t rem = m & ((1u << shift) - 1u), mid = 1u << (shift - 1u);
    uint32_t h = m >> shift;
    if (rem > mid || (rem == mid && (h & 1u))) h++;
    return sign | h;
  }
  uint32_t h = (uint32_t)e << 10 | man >> 13;
  const uint32_t rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* a carry into the exponent is right */
  return sign | h;
}

/* A half scale, byte by byte (blocks leave it 2-byte aligned at best). The
** bits come from integer rounding, never from a cvt to f16: ptxas (CUDA 13.0,
** sm_90) compiled `st.u8` of the low byte of a cvt.rn.f16.f32 result into
** F2I.U8.F16 (the half's value converted to an integer, 0 for |d| < 1), so
** every block scale lost its low byte on the device while the host build of
** the same code was right. */
CU_HD static inline void st_h(uint8_t *p, float f) {
  const uint32_t h = f_h16(f);
  p[0] = (uint8_t)(h & 0xffu);
  p[1] = (uint8_t)(h >> 8);
}

/* One plain element (f32, f16, bf16) at p. */
CU_HD static inline void st_plain(int t, char *p, float f) {
  if (t == T_F32) *reinterpret_cast<float *>(p) = f;
  else if (t == T_F16) *reinterpret_cast<__half *>(p) = __float2half_rn(f);
  else if (t == T_BF16) *reinterpret_cast<uint16_t *>(p) = f_bf16(f);
}

CU_HD static inline float signed_absmax32(const float *x) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; j++)
    if (amax < fabsf(x[j])) amax = fabsf(x[j]), max = x[j];
  return max;
}

CU_HD static inline void q5_pack(const int *q, uint8_t *qh, uint8_t *qs) {
  uint32_t h = 0;
  for (int j = 0; j < 16; j++) {
    qs[j] = (uint8_t)((q[j] & 0x0f) | (q[j + 16] & 0x0f) << 4);
    h |= (uint32_t)((q[j] >> 4) & 1) << j;
    h |= (uint32_t)((q[j + 16] >> 4) & 1) << (j + 16);
  }
  for (int k = 0; k < 4; k++) qh[k] = (uint8_t)(h >> (8 * k));
}

/* One 32-value block of type t from x, as core/graph/quant.c's reference quantizers. */
CU_HD static inline void quant_block32(int t, const float *x, uint8_t *b) {
  int q[32];
  if (t == T_Q8_0) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = RN_DIV(amax, 127.0f), id = d != 0.0f ? RN_DIV(1.0f, d) : 0.0f;
    st_h(b, d);
    for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)roundf(RN_MUL(x[j], id));
  } else if (t == T_Q4_0 || t == T_Q5_0 || t == T_Q6_0) {
    const float lv = t == T_Q4_0 ? 8.0f : t == T_Q5_0 ? 16.0f : 32.0f;
    const int top = t == T_Q4_0 ? 15 : t == T_Q5_0 ? 31 : 63;
    const float m = signed_absmax32(x);
    /* q6_0 stores +0 for an all-zero block, not the -0 that 0 / -32 is */
    const float d = t == T_Q6_0 && m == 0.0f ? 0.0f : RN_DIV(m, -lv);
    const float id = d != 0.0f ? RN_DIV(1.0f, d) : 0.0f;
    st_h(b, d);
    for (int j = 0; j < 32; j++) {
      q[j] = (int)RN_ADD(RN_MUL(x[j], id), lv + 0.5f);
      if (q[j] > top) q[j] = top;
    }
    if (t == T_Q4_0) {
      for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(q[j] | q[j + 16] << 4);
    } else if (t == T_Q5_0) {
      q5_pack(q, b + 2, b + 6);
    } else {
      for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)((q[j] & 0x0f) | (q[j + 16] & 0x0f) << 4);
      for (int j = 0; j < 8; j++)
        b[18 + j] = (uint8_t)((q[j] >> 4) | (q[j + 8] >> 4) << 2 | (q[j + 16] >> 4) << 4 |
                              (q[j + 24] >> 4) << 6);
    }
  } else if (t == T_Q4_1 || t == T_Q5_1) {
    const int top = t == T_Q4_1 ? 15 : 31;
    float mn = x[0], mx = x[0];
    for (int j = 1; j < 32; j++) {
      if (x[j] < mn) mn = x[j];
      if (x[j] > mx) mx = x[j];
    }
    const float d = RN_DIV(RN_SUB(mx, mn), (float)top);
    const float id = d != 0.0f ? RN_DIV(1.0f, d) : 0.0f;
    st_h(b, d);
    st_h(b + 2, mn);
    for (int j = 0; j < 32; j++) {
      q[j] = (int)RN_ADD(RN_MUL(RN_SUB(x[j], mn), id), 0.5f);
      if (q[j] > top) q[j] = top;
    }
    if (t == T_Q4_1) {
      for (int j = 0; j < 16; j++) b[4 + j] = (uint8_t)(q[j] | q[j + 16] << 4);
    } else {
      q5_pack(q, b + 4, b + 8);
    }
  }
}

#endif
