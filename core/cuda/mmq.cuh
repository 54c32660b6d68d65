/*
** Quantized products on integer tensor cores (kernels_matmul.cu): the weights in their own
** block type, x coded to 8 bits per 32 values (x8_block, as the q8 gemv codes it), each
** 32-weight chunk of 16 rows against 8 columns one mma.sync (m16n8k32 .s8, int32 sums;
** q6_K, whose chunk has two scales, two m16n8k16), then the chunk's scales in f32 exactly
** as the gemv's x8_dot applies them. Only the order the chunks' f32 terms are summed in
** differs from the gemv.
**
** Fragment layouts (PTX ISA, integer mma; lane = 4 g + t; the byte order of a word is k
** order): m16n8k32 A (16x32, row-major) a0 = (g, 4t..4t+3), a1 = (g+8, 4t..), a2 = (g,
** 16+4t..), a3 = (g+8, 16+4t..); B (32x8) b0 = (4t..4t+3, g), b1 = (16+4t.., g); C (16x8)
** c0, c1 = (g, 2t..2t+1), c2, c3 = (g+8, 2t..2t+1). m16n8k16: a0 = (g, 4t..), a1 = (g+8,
** 4t..), b0 = (4t.., g). A chunk's word i holds its weights 4i..4i+3 (x8_decode's order),
** so a lane reads words t and 4+t of its two rows and of its column's x codes.
** The helpers are host and device: core/cuda/tests/test_cuda_mmq.cu runs them on the CPU
** through an emulated mma against x8_decode and x8_dot.
*/
#ifndef TSR_CUDA_MMQ_CUH
#define TSR_CUDA_MMQ_CUH

#include "tessera/cuda_quant.cuh"

#define MMQ_ROWS 16 /* rows of a warp's tile (the fragment's) */
#define MMQ_COLS 8  /* columns of an n tile */

/* What lane t needs of chunk c of a row: its two code words (t: weights 4t..4t+3, and
** 4+t: 16+4t..), the chunk's scale d and min m (q4_K), and q6_K's two half scales. */
struct mmq_part {
  int lo, hi;
  float d, m;
  int s0, s1;
};

CU_HD static inline uint32_t mmq_ld(const uint8_t *p, int wide) {
  return wide ? *reinterpret_cast<const uint32_t *>(p) : ld_u32_a2(p);
}

/* Lane t's part of chunk c (weights 32c .. 32c+31) of a row of type T (x8_supported);
** wide: a q4_K row starts 4-byte aligned (one load a word, else two). */
template <int T>
CU_HD static inline void mmq_part_of(const uint8_t *row, int64_t c, int t, int wide,
                                     struct mmq_part *p) {
  p->m = 0.0f, p->s0 = p->s1 = 0;
  if (T == T_Q4_0) { /* d qs[16]: weight i < 16 the low nibble of qs[i], i + 16 the high */
    const uint8_t *b = row + c * 18;
    const uint32_t u = ld_u32_a2(b + 2 + 4 * t);
    p->lo = sub4_u8(u & 0x0f0f0f0fu, 0x08080808u);
    p->hi = sub4_u8(u >> 4 & 0x0f0f0f0fu, 0x08080808u);
    p->d = ld_h(b);
  } else if (T == T_Q8_0) {
    const uint8_t *b = row + c * 34;
    p->lo = (int)ld_u32_a2(b + 2 + 4 * t);
    p->hi = (int)ld_u32_a2(b + 18 + 4 * t);
    p->d = ld_h(b);
  } else if (T == T_Q4_K) { /* d dmin scales[12] qs[128]; chunk = sub-block c % 8 */
    const uint8_t *b = row + c / 8 * 144;
    const int j = (int)(c % 8), sh = 4 * (j % 2);
    int sc, m;
    k4_scale(b + 4, j, &sc, &m);
    p->d = ld_h(b) * sc, p->m = ld_h(b + 2) * m;
    const uint8_t *qs = b + 16 + 32 * (j / 2);
    p->lo = (int)(mmq_ld(qs + 4 * t, wide) >> sh & 0x0f0f0f0fu);
    p->hi = (int)(mmq_ld(qs + 16 + 4 * t, wide) >> sh & 0x0f0f0f0fu);
  } else if (T == T_Q6_K) { /* ql[128] qh[64] scales[16] d; chunk = 32 of 256 */
    const uint8_t *b = row + c / 8 * 210;
    const int cc = (int)(c % 8), h = cc / 4, k = cc % 4;
    const uint8_t *ql = b + 64 * h + 32 * (k & 1), *qh = b + 128 + 32 * h;
    int w[2];
    for (int i = 0; i < 2; i++) {
      const int o = 4 * (t + 4 * i);
      const uint32_t lo = ld_u32_a2(ql + o) >> 4 * (k >> 1) & 0x0f0f0f0fu;
      const uint32_t hi = (ld_u32_a2(qh + o) >> 2 * k & 0x03030303u) << 4;
      w[i] = sub4_u8(lo | hi, 0x20202020u);
    }
    p->lo = w[0], p->hi = w[1];
    p->d = ld_h(b + 208);
    p->s0 = (int8_t)b[192 + 2 * cc], p->s1 = (int8_t)b[192 + 2 * cc + 1];
  }
}

/* x as the kernels read it: each column's chunks of 32 codes with the chunk's words in the
** order 0 4 1 5 2 6 3 7, so lane t's two words (t, 4 + t) are one 8-byte load; scales as
** (d, code sum) pairs, chunk-major, so a lane's two columns (2t, 2t + 1) are one 16-byte
** load. Byte offset of code i (0..31) within its chunk: */
CU_HD static inline int mmq_code_at(int i) {
  const int word = i / 4;
  return 4 * (word < 4 ? 2 * word : 2 * (word - 4) + 1) + i % 4;
}

/* Chunk sums of one row and one column as f32, x8_dot's expression: lo and hi the integer
** sums over weights 0..15 and 16..31 (types with one scale may pass the whole sum in lo
** and 0 in hi), xd and xs the column's scale and code sum. */
template <int T>
CU_HD static inline float mmq_scaled(const struct mmq_part *p, int lo, int hi, float xd, int xs) {
  if (T == T_Q4_K) return xd * (p->d * (float)(lo + hi) - p->m * (float)xs);
  if (T == T_Q6_K) return xd * (p->d * (float)(p->s0 * lo + p->s1 * hi));
  return xd * (p->d * (float)(lo + hi));
}

#endif
